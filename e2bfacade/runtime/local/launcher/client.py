"""The runtime's side of sandboxd's wire (launcher/c/launch.c's header states it): a launch request
is NUL-separated ``key=value`` items ended by an empty one; the answer is one line, ``OK
<init pid>`` (a spare launcher: ``OK <init pid> <its own pid>``) or ``ERR <step>: <why>``."""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Callable
from pathlib import Path

from e2bfacade.runtime.base import CreateRefused, RuntimeUnavailable
from e2bfacade.runtime.local.cgroups import Cgroups

TIMEOUT = 30.0  # a launch takes milliseconds; a wedged daemon must not hold a create


def payload(request: list[str]) -> bytes:
    if any("\0" in item for item in request):  # NUL separates items on the wire
        raise CreateRefused("a launch parameter contains a NUL byte")
    return b"".join(item.encode() + b"\0" for item in request) + b"\0"


def _reply(s: socket.socket) -> str:
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply.decode(errors="replace").strip()


def _refused(text: str) -> CreateRefused:
    return CreateRefused(f"sandbox launch failed: {text.removeprefix('ERR ') or 'no reply'}")


class Launcher:
    """Launches sandboxes through the root's daemon (started on first use by
    ``ensure_daemon``) or through a spare launcher parked ahead (pools/spares.py)."""

    def __init__(self, ensure_daemon: Callable[[], Path], cgroups: Cgroups) -> None:
        self._ensure_daemon = ensure_daemon
        self._cgroups = cgroups

    def launch(self, request: list[str]) -> int:
        """Launch through the daemon; the init's host pid. Raises CreateRefused."""
        data = payload(request)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(TIMEOUT)
            s.connect(str(self._ensure_daemon()))
            s.sendall(data)
            text = _reply(s)
        if text.startswith("OK "):
            return int(text[3:])
        raise _refused(text)

    def launch_spare(self, sandbox_id: str, launcher: Path, request: list[str]) -> int | None:
        """Launch through the parked launcher listening on ``launcher``; None when it is gone
        (a reboot, its daemon killed): the caller launches through the daemon instead."""
        data = payload(request)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(TIMEOUT)
            try:
                s.connect(str(launcher))
                s.sendall(data)
                text = _reply(s)
            except OSError:
                text = ""
            if not text:
                # Dead, perhaps halfway: whatever it started is in the sandbox's groups.
                # End that and let the caller launch afresh.
                self._cgroups.kill_all(sandbox_id)
                if not self._cgroups.wait_empty(sandbox_id):
                    raise RuntimeUnavailable(f"sandbox {sandbox_id}: processes survived SIGKILL")
                return None
            if not text.startswith("OK "):
                raise _refused(text)
            init, helper = (int(x) for x in text[3:].split())
            # The launcher is in the sandbox's groups until it exits, which it does once we
            # hang up: wait for that, so the init is the sandbox's only process on return.
            pidfd = os.pidfd_open(helper)
        try:
            select.select([pidfd], [], [], 5.0)
        finally:
            os.close(pidfd)
        return init
