"""Blocking runtime calls and iterators, used from the event loop, within shares.

A runtime call blocks (it talks to a sandbox's agent, or to the guest's files), so it runs
on a thread of :data:`EXECUTOR`. An iterator is pumped by one such thread into the loop with
at most ``window`` items in flight: when the client reads slowly, the thread stops reading
the sandbox, the sandbox's agent stops reading the command, and the command blocks. Nothing
is buffered without bound on the way.

The threads are shared by every sandbox a worker serves, so each call is made within its
caller's share (:func:`share`): one sandbox holds at most ``DATAPLANE_SANDBOX_THREADS`` of
them at once, one team at most ``DATAPLANE_TEAM_THREADS``. A call past its share waits for
a thread of it in the loop (holding no thread), at most ``DATAPLANE_ADMIT_SECONDS``, then
fails with :class:`Busy`. So a guest that stops its own agent (each call to it then waits
out the agent's 30 s timeout), or a client that opens a thousand uploads, exhausts only its
own share. No thread ever waits on the loop through this pool: what a thread needs from the
loop (an upload's body) is handed over by the loop without a thread (:class:`Feed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from django.conf import settings

T = TypeVar("T")
P = ParamSpec("P")

EXECUTOR = ThreadPoolExecutor(
    max_workers=settings.DATAPLANE_THREADS, thread_name_prefix="dataplane"
)
_DONE = object()


class Busy(ConnectError):
    """The caller's share of the threads stayed full for ``DATAPLANE_ADMIT_SECONDS``: a
    Connect call ends with resource_exhausted (429 when unary, which the SDKs raise as a
    rate limit), a ``/files`` request is answered 429 (files.py)."""

    def __init__(self, what: str) -> None:
        super().__init__(
            Code.RESOURCE_EXHAUSTED,
            f"too many concurrent requests to this {what}: try again when some have finished",
        )


@dataclass(frozen=True)
class Share:
    """Whose threads a call takes: a sandbox's, within its team's."""

    sandbox_id: str
    team: str


_share: contextvars.ContextVar[Share | None] = contextvars.ContextVar(
    "dataplane_share", default=None
)


def share(value: Share) -> contextvars.Token[Share | None]:
    """Make the calls of the request being served (its context) count against ``value``."""
    return _share.set(value)


def unshare(token: contextvars.Token[Share | None]) -> None:
    _share.reset(token)


class _Slots:
    """At most ``size`` holders of one key; waiters are served in order. Loop-only."""

    def __init__(self) -> None:
        self.used = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def take(self, size: int, deadline: float) -> bool:
        if self.used < size and not self.waiters:
            self.used += 1
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self.waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, max(deadline - loop.time(), 0))
            return True
        except TimeoutError:
            # Handed over just as the wait ended: it is ours all the same.
            return waiter.done() and not waiter.cancelled()
        finally:
            with contextlib.suppress(ValueError):
                self.waiters.remove(waiter)

    def give(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to it: ``used`` stays
                return
        self.used -= 1


class _Limit:
    """Slots by key (sandbox id, or team), kept only while held or waited for."""

    def __init__(self, size: Callable[[], int]) -> None:
        self.size = size
        self.keys: dict[str, _Slots] = {}

    async def take(self, key: str, deadline: float) -> bool:
        slots = self.keys.setdefault(key, _Slots())
        taken = await slots.take(self.size(), deadline)
        if not taken and slots.used == 0 and not slots.waiters:
            del self.keys[key]
        return taken

    def give(self, key: str) -> None:
        slots = self.keys[key]
        slots.give()
        if slots.used == 0 and not slots.waiters:
            del self.keys[key]

    def held(self, key: str) -> int:
        slots = self.keys.get(key)
        return 0 if slots is None else slots.used


SANDBOXES = _Limit(lambda: settings.DATAPLANE_SANDBOX_THREADS)
TEAMS = _Limit(lambda: settings.DATAPLANE_TEAM_THREADS)


@contextlib.asynccontextmanager
async def slot() -> AsyncIterator[None]:
    """A thread of the current share held for the block (none is counted outside a
    request's share: the lookups that find the sandbox). Raises :class:`Busy`."""
    held = _share.get()
    if held is None:
        yield
        return
    deadline = asyncio.get_running_loop().time() + settings.DATAPLANE_ADMIT_SECONDS
    if not await SANDBOXES.take(held.sandbox_id, deadline):
        raise Busy("sandbox")
    try:
        if not await TEAMS.take(held.team, deadline):
            raise Busy("team")
        try:
            yield
        finally:
            TEAMS.give(held.team)
    finally:
        SANDBOXES.give(held.sandbox_id)


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on a thread, in the caller's context, outside any share (the
    caller holds a :func:`slot` for it)."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    return await loop.run_in_executor(EXECUTOR, lambda: context.run(fn, *args, **kwargs))


async def call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on a thread of the caller's share, in the caller's context
    (its context vars). The share's thread is held until ``fn`` returns, even when the
    caller is cancelled first: it is counted for as long as it is taken."""
    async with slot():
        future = asyncio.ensure_future(run(fn, *args, **kwargs))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await future
            raise


async def pump(
    source: Iterator[T], *, window: int = 8, close: Callable[[], None]
) -> AsyncIterator[T]:
    """The items of ``source``, produced on a thread of the caller's share (held for as
    long as the iteration). ``close`` unblocks the thread when the consumer stops early
    (it must make ``source`` end: close its connection)."""
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[object] = asyncio.Queue()
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
                loop.call_soon_threadsafe(items.put_nowait, item)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            if not stopped.is_set():
                loop.call_soon_threadsafe(items.put_nowait, _Failed(exc))
            return
        if not stopped.is_set():
            loop.call_soon_threadsafe(items.put_nowait, _DONE)

    async with slot():
        producer = asyncio.ensure_future(run(produce))
        try:
            while True:
                item = await items.get()
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
            # The share's thread is given back once the producer has let go of it.
            with contextlib.suppress(BaseException):
                await asyncio.shield(producer)


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Aborted(Exception):
    """What a :class:`Feed`'s consumer gets when the feeding side gave up."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Feed:
    """Chunks the loop hands to one consuming thread, ``window`` at most in flight.

    The loop never blocks and never needs a thread to hand a chunk over (:meth:`put` waits
    for room in the loop); the thread waits only for the loop's own ``put_nowait``. (A
    consumer whose producer needs a thread of the same pool deadlocks once the pool is
    full of consumers: the threads wait for chunks that only a thread could hand over.)"""

    def __init__(self, window: int) -> None:
        self._chunks: queue.SimpleQueue[bytes | None | Aborted] = queue.SimpleQueue()
        self._room = asyncio.Semaphore(window)
        self._loop = asyncio.get_running_loop()
        self._ended = False

    async def put(self, chunk: bytes) -> None:
        await self._room.acquire()
        self._chunks.put(chunk)

    def end(self) -> None:
        """The body is complete."""
        if not self._ended:
            self._ended = True
            self._chunks.put(None)

    def abort(self, message: str) -> None:
        """The body will not be complete: the consumer's next read raises Aborted."""
        if not self._ended:
            self._ended = True
            self._chunks.put(Aborted(message))

    def __iter__(self) -> Iterator[bytes]:
        """On the consuming thread."""
        while True:
            chunk = self._chunks.get()
            if chunk is None:
                return
            if isinstance(chunk, Aborted):
                raise chunk
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to tell
                self._loop.call_soon_threadsafe(self._room.release)
            yield chunk
