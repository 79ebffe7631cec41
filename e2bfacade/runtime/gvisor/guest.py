"""How the host reaches a gVisor sandbox's guest (Sandboxer.reach: the guest side itself is
the host runtime's, local/guest/handle.py), three differences from a namespace sandbox's:

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
  file operation made from the host tells the agent what it changed (``tells_watchers``),
  so a watcher gets the events inotify would have given it (create, write, remove, rename).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path

from e2bfacade.runtime.base import GuestFileError
from e2bfacade.runtime.gvisor.link import AGENT_PORT
from e2bfacade.runtime.local.guest.reach import runs
from e2bfacade.runtime.local.guest.syscalls import SandboxGone
from e2bfacade.runtime.local.net.rules import Link
from e2bfacade.runtime.local.record import SandboxRecord


class GvisorReach:
    tells_watchers = True

    def __init__(
        self, record: SandboxRecord, root: Path, link: Link, frozen: Callable[[], bool]
    ) -> None:
        self.record = record
        self.agent: Path | tuple[str, int] = (link.guest_ip, AGENT_PORT)
        self.id_base = 0  # files keep guest ids (bundle.py)
        self._root_path = root
        self._link = link
        self._frozen = frozen

    def open_root(self) -> int:
        """The root tree, only while it is mounted on the sandbox's disk: never the bare
        directory under it, which is the host's."""
        sid = self.record.sandbox_id
        if not runs(self.record, self._frozen):
            raise SandboxGone(f"sandbox {sid} is not running")
        fd = os.open(self._root_path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_dev == os.stat(self._root_path.parent).st_dev:
                raise SandboxGone(f"sandbox {sid}'s root is not mounted")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def connect_port(self, port: int, timeout: float) -> socket.socket:
        if not 0 < port < 65536 or port == AGENT_PORT:
            raise GuestFileError(errno.EINVAL, f"port {port} is not a TCP port of the guest")
        try:
            sock = socket.create_connection((self._link.guest_ip, port), timeout=timeout)
        except OSError as exc:
            code = exc.errno or errno.ECONNREFUSED
            raise GuestFileError(code, f"port {port} is not open in the sandbox") from None
        sock.settimeout(None)
        return sock
