"""Blocking runtime calls and iterators, used from the event loop.

A runtime call blocks (it talks to a sandbox's agent, or to the guest's files), so it runs
on a thread of :data:`EXECUTOR`, a pool sized for streams that last as long as the commands
they follow. An iterator is pumped by one such thread into the loop with at most
``window`` items in flight: when the client reads slowly, the thread stops reading the
sandbox, the sandbox's agent stops reading the command, and the command blocks. Nothing is
buffered without bound on the way.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

EXECUTOR = ThreadPoolExecutor(max_workers=512, thread_name_prefix="dataplane")
_DONE = object()


async def call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on a thread, in the caller's context (its context vars)."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    return await loop.run_in_executor(EXECUTOR, lambda: context.run(fn, *args, **kwargs))


async def pump(
    source: Iterator[T], *, window: int = 8, close: Callable[[], None]
) -> AsyncIterator[T]:
    """The items of ``source``, produced on a thread. ``close`` unblocks the thread when
    the consumer stops early (it must make ``source`` end: close its connection)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()
    slots = threading.Semaphore(window)
    stopped = threading.Event()

    def produce() -> None:
        try:
            for item in source:
                while not slots.acquire(timeout=0.5):
                    if stopped.is_set():
                        return
                if stopped.is_set():
                    return
                loop.call_soon_threadsafe(queue.put_nowait, item)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            if not stopped.is_set():
                loop.call_soon_threadsafe(queue.put_nowait, _Failed(exc))
            return
        if not stopped.is_set():
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)

    loop.run_in_executor(EXECUTOR, produce)  # ends on its own once close() is called
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.exc
            slots.release()
            yield item  # type: ignore[misc]
    finally:
        stopped.set()
        close()
        slots.release()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
