"""One running gVisor sandbox's guest side: the local driver's (local/guest/handle.py) with three
differences of reach.

- Processes and watchers: the same guest agent, inside gVisor, reached over the sandbox's
  link (its guest address, :data:`.link.AGENT_PORT`) instead of a unix socket.
- Files: the sandbox's root tree on the host (bundle.py), which gVisor's gofer serves with
  shared file access (the sentry revalidates what it caches, so a host-side write is seen
  inside at once); the files keep the guest's own ids, so the user's host id is its guest
  id. ``/proc``, ``/sys``, ``/dev`` and ``/run`` there are empty and read-only: those are
  gVisor's own inside (a read of ``/proc`` and ``/sys`` files goes through the agent, as on
  the local driver).
- Ports: a TCP connection to the guest's address, answered by gVisor's network stack; so a
  service must listen on the guest's address (``0.0.0.0``), not only on its loopback.
- Watchers: the agent's inotify, inside gVisor, sees only what the guest itself does; each
  file operation made from the host tells the agent what it changed (``Agent.notify``), so
  a watcher gets the events inotify would have given it (create, write, remove, rename).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath

from e2bfacade.runtime.base import (
    EntryInfo,
    FileType,
    FsChange,
    GuestFileError,
    SandboxInfo,
)
from e2bfacade.runtime.gvisor.link import AGENT_PORT
from e2bfacade.runtime.local.guest.handle import LocalGuest
from e2bfacade.runtime.local.guest.syscalls import SandboxGone
from e2bfacade.runtime.local.net.rules import Link
from e2bfacade.runtime.local.record import SandboxRecord


class GvisorGuest(LocalGuest):
    def __init__(
        self,
        record: SandboxRecord,
        info: SandboxInfo,
        root: Path,
        link: Link,
        frozen: Callable[[], bool],
    ) -> None:
        # Files keep guest ids (bundle.py): the user's host id is its guest id.
        super().__init__(record, info, (link.guest_ip, AGENT_PORT), frozen, id_base=0)
        self._root_path = root
        self._link = link

    def open_root(self) -> int:
        """The root tree, only while it is mounted on the sandbox's disk: never the bare
        directory under it, which is the host's."""
        if not self.running():
            raise SandboxGone(f"sandbox {self.sandbox_id} is not running")
        fd = os.open(self._root_path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_dev == os.stat(self._root_path.parent).st_dev:
                raise SandboxGone(f"sandbox {self.sandbox_id}'s root is not mounted")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def connect_port(self, port: int, *, timeout: float = 5.0) -> socket.socket:
        if not 0 < port < 65536 or port == AGENT_PORT:
            raise GuestFileError(errno.EINVAL, f"port {port} is not a TCP port of the guest")
        try:
            sock = socket.create_connection((self._link.guest_ip, port), timeout=timeout)
        except OSError as exc:
            code = exc.errno or errno.ECONNREFUSED
            raise GuestFileError(code, f"port {port} is not open in the sandbox") from None
        sock.settimeout(None)
        return sock

    # ---------------------------------------------------- file operations, told to watchers
    def _tell(self, *changes: tuple[FsChange, str, bool]) -> None:
        """Tell the guest's watchers (best effort: a guest that stopped its agent loses
        only its own events)."""
        for change, path, is_dir in changes:
            try:
                self._agent.notify(change, path, is_dir=is_dir)
            except (GuestFileError, OSError):
                return

    def _where(self, path: str, user: str | None) -> tuple[str, bool]:
        """The guest path of ``path`` for ``user``, and whether something is there."""
        with self._files(user) as files:
            where = files.path(path)
            try:
                files.stat(where)
            except GuestFileError:
                return where, False
            return where, True

    def write_file(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        user: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> EntryInfo:
        where, existed = self._where(path, user)
        entry = super().write_file(path, chunks, user=user, metadata=metadata)
        # What inotify reports for the same write on the local driver (local/guest/files.py: the
        # content, then its mode, then the content again over an existing file).
        first = FsChange.WRITE if existed else FsChange.CREATE
        self._tell(*((change, where, False) for change in (first, FsChange.CHMOD, FsChange.WRITE)))
        return entry

    def make_dir(self, path: str, *, user: str | None = None) -> bool:
        where, _ = self._where(path, user)
        missing: list[str] = []  # the directories this makes, outermost first
        parent = PurePosixPath(where)
        while str(parent) != "/" and not self._where(str(parent), user)[1]:
            missing.insert(0, str(parent))
            parent = parent.parent
        made = super().make_dir(path, user=user)
        self._tell(*((FsChange.CREATE, d, True) for d in missing))
        return made

    def remove(self, path: str, *, user: str | None = None) -> None:
        where, existed = self._where(path, user)
        super().remove(path, user=user)
        if existed:
            self._tell((FsChange.REMOVE, where, False))

    def move(self, source: str, destination: str, *, user: str | None = None) -> EntryInfo:
        src, _ = self._where(source, user)
        entry = super().move(source, destination, user=user)
        is_dir = entry.type is FileType.DIRECTORY
        self._tell((FsChange.RENAME, src, is_dir), (FsChange.CREATE, entry.path, is_dir))
        return entry
