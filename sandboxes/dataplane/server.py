"""The data plane's server: ``python -m sandboxes.dataplane.server HOST PORT WORKERS``.

uvicorn serving :data:`sandboxes.dataplane.app.application` in ``WORKERS`` processes that
share one listening socket. uvicorn's own ``--workers`` would do, but it makes its socket
without naming the protocol, and asyncio then leaves ``TCP_NODELAY`` off on every accepted
connection: on a kept-alive connection each response's second segment then waits for the
client's delayed ACK, 40 ms per call (measured: 44 ms per Stat). Here the socket is made
as TCP explicitly, so asyncio sets ``TCP_NODELAY`` as it does for its own servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import socket
import struct
import sys
from typing import Any

import uvicorn
import uvicorn.protocols.http.h11_impl

from e2bfacade.supervision import exit_with_parent


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class H11Protocol(uvicorn.protocols.http.h11_impl.H11Protocol):
    """uvicorn's HTTP/1.1 protocol, handing the app a way to reset its connection
    (``scope["extensions"]["e2bfacade.reset"]``): a stream whose sandbox ended is cut with a
    TCP reset, as a dropped connection to a VM that went away looks (target.Response)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        app = self.app

        async def with_reset(scope: dict[str, Any], receive: Any, send: Any) -> None:
            extensions = {**scope.get("extensions", {}), "e2bfacade.reset": self._reset}
            await app({**scope, "extensions": extensions}, receive, send)

        self.app = with_reset

    def _reset(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
        self.transport.abort()
        # The response ends here: marked at once (connection_lost, which marks it too, runs
        # only on the loop's next turn), so that the app returning right after the reset is
        # not reported as a response it left incomplete.
        if self.cycle is not None:
            self.cycle.disconnected = True


def serve(sock: socket.socket) -> None:
    config = uvicorn.Config(
        "sandboxes.dataplane.app:application",
        http=H11Protocol,
        lifespan="on",
        access_log=False,
        # As envd: kept-alive connections may be quiet for minutes between keepalives.
        timeout_keep_alive=650,
        # Streams follow commands for as long as they run: on shutdown they are cut after
        # this (their commands go on, and a client reconnects to them).
        timeout_graceful_shutdown=5,
    )
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


def main(host: str, port: int, workers: int) -> int:
    # Below the control plane in the CPU's queue (DATAPLANE_NICE, default 5): a flood of
    # output streams then slows the streams, not the API's answers.
    os.nice(int(os.environ.get("DATAPLANE_NICE", "5")))
    sock = listen(host, port)
    if workers <= 1:
        serve(sock)
        return 0
    # Imported once, here, and forked: each worker then costs a fork, not an import of
    # Django and the app (nothing at import opens a connection or starts a thread).
    importlib.import_module("sandboxes.dataplane.app")
    children = []
    master = os.getpid()
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            # A master that dies (SIGKILL, the OOM killer) takes its workers with it: left
            # running, they would go on answering on the port and hold it against the next
            # start. SIGTERM: they stop listening at once and finish their streams.
            exit_with_parent(master)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            serve(sock)
            os._exit(0)
        children.append(pid)
    # The workers listen; the master only waits for them. Its copy of the socket closed,
    # the port is free as soon as the workers are gone, while it still waits on them.
    sock.close()

    def stop(signum: int, frame: object) -> None:
        for child in children:
            try:
                os.kill(child, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # One worker gone is the whole server gone: the supervisor restarts it.
    _, status = os.wait()
    stop(signal.SIGTERM, None)
    for child in children:
        try:
            os.waitpid(child, 0)
        except ChildProcessError:
            pass
    return 0 if os.waitstatus_to_exitcode(status) == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m sandboxes.dataplane.server HOST PORT WORKERS")
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
