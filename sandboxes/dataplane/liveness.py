"""The open requests of a sandbox end when the sandbox stops running under them.

On E2B a pause snapshots the VM and every connection to it drops at once. Here a memory
pause freezes the guest's processes and ends none of them: a stream that follows a command,
a watch, a forwarded port's response would wait on a frozen guest until the client gave up.
So each worker checks, once a second, every sandbox it has requests open to
(:meth:`Guest.running`: a few reads of the kernel's state, on the loop) and cuts all of
them when the sandbox no longer runs — paused, parked or killed — as a kill cuts a stream
(target.Response, target.cut_connection): the client sees a reset, asks /health and reports
the sandbox as not running.

One check task per sandbox per worker, from its first open request to its last (not one
per stream), so the cost is bounded by the sandboxes a worker serves, not by its streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from e2bfacade.runtime.guest import Guest
from sandboxes.dataplane.target import Response

log = logging.getLogger(__name__)
CHECK_SECONDS = 1.0
# The reason a cut request logs: the one a stream that sees its sandbox killed logs.
ENDED = "the sandbox ended while the stream was open"


@dataclass(eq=False)
class Open:
    """One open request: its task, and how its response must end. ``cut``: this watch
    cancelled the task because the sandbox stopped running (its owner then cuts the
    connection, and takes the cancellation back)."""

    task: asyncio.Task[object]
    response: Response
    cut: bool = False


@dataclass(eq=False)
class _Sandbox:
    guest: Guest
    open: set[Open] = field(default_factory=set)
    checker: asyncio.Task[None] | None = None


_sandboxes: dict[str, _Sandbox] = {}


@contextlib.contextmanager
def watched(guest: Guest, response: Response) -> Iterator[Open]:
    """The current request, counted open to ``guest``'s sandbox for the block: cancelled
    (``Open.cut`` set, and ``response.cut``) within about ``CHECK_SECONDS`` of the sandbox
    no longer running."""
    task = asyncio.current_task()
    assert task is not None
    sandbox = _sandboxes.get(guest.sandbox_id)
    if sandbox is None:
        sandbox = _sandboxes[guest.sandbox_id] = _Sandbox(guest)
        sandbox.checker = asyncio.get_running_loop().create_task(_check(sandbox))
    else:
        # The newest resolution is the one checked: a sandbox booted again (resumed from
        # its files) has a new init, and its new requests must not be cut for the old one's
        # end (the old one's streams end on their own: their agent is gone).
        sandbox.guest = guest
    entry = Open(task, response)
    sandbox.open.add(entry)
    try:
        yield entry
    finally:
        sandbox.open.discard(entry)
        if not sandbox.open:
            if sandbox.checker is not None:
                sandbox.checker.cancel()
            if _sandboxes.get(guest.sandbox_id) is sandbox:
                del _sandboxes[guest.sandbox_id]


async def _check(sandbox: _Sandbox) -> None:
    while True:
        await asyncio.sleep(CHECK_SECONDS)
        try:
            running = sandbox.guest.running()
        except Exception:  # noqa: BLE001 - a check that fails says nothing: check again
            log.warning("data plane: cannot check sandbox %s", sandbox.guest.sandbox_id)
            continue
        if running:
            continue
        for entry in sandbox.open:
            if not entry.cut:
                entry.cut = entry.response.cut = True
                entry.task.cancel()
