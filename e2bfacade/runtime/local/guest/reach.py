"""How the host reaches one running sandbox's guest — where its agent listens, how its root
is opened, how its ports are dialled — as its sandboxer gives it (Sandboxer.reach): the
guest side (handle.py) is the same for every sandboxer, over its reach."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from e2bfacade.runtime.base import GuestFileError
from e2bfacade.runtime.local.guest.syscalls import open_guest_root
from e2bfacade.runtime.local.net import netns
from e2bfacade.runtime.local.record import SandboxRecord
from e2bfacade.runtime.local.state import proc_starttime


class GuestReach(Protocol):
    # Its agent: a unix socket on the host, or an address on the sandbox's link.
    agent: Path | tuple[str, int]
    # The host id its files store for guest id 0 (what the host's file operations act as).
    id_base: int
    # Whether the guest's own inotify misses what the host does to its files, which the
    # host then tells its agent (each file operation's changes) for its watchers.
    tells_watchers: bool

    def open_root(self) -> int:
        """An O_PATH descriptor of the guest's root (SandboxGone when it is not running)."""
        ...

    def connect_port(self, port: int, timeout: float) -> socket.socket:
        """A TCP connection to what listens on ``port`` in the guest (GuestFileError:
        EINVAL for a port the host may not reach, ECONNREFUSED when nothing listens)."""
        ...


def runs(record: SandboxRecord, frozen: Callable[[], bool]) -> bool:
    """Whether the sandbox's init as ``record`` names it still runs, not frozen: a read of
    /proc/<pid>/stat and of the freezer's file (census.status_of decides the same way)."""
    return proc_starttime(record.init_pid) == record.init_start and not frozen()


class NamespaceReach:
    """A sandbox in Linux namespaces (the ``local`` driver's): its agent on a unix socket in
    its directory, its root through its init's ``/proc/<pid>/root``, its ports through a
    socket made in its network namespace; its files stored in its id range."""

    tells_watchers = False

    def __init__(self, record: SandboxRecord, agent_socket: Path) -> None:
        self.record = record
        self.agent: Path | tuple[str, int] = agent_socket
        self.id_base = record.id_base

    def open_root(self) -> int:
        return open_guest_root(self.record.init_pid, self.record.init_start)

    def connect_port(self, port: int, timeout: float) -> socket.socket:
        if not 0 < port < 65536:
            raise GuestFileError(errno.EINVAL, f"port {port} is not a TCP port")
        return netns.connect(self.record.init_pid, self.record.init_start, port, timeout)
