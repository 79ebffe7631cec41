"""Spare launchers: processes already in a sandbox's cgroups, so a create migrates none.

Joining a cgroup on v1 takes the kernel's threadgroup lock for writing, which waits for an
RCU grace period unless another migration happened on the host a moment before: 8 to 16 ms
on these machines after a quiet gap, which is exactly the situation of an interactive
create (0.03 ms back to back). A create used to pay that twice (the launcher joins the
sandbox's groups, then leaves them). A spare pays it while nobody waits:

1. :meth:`Spares.fill` makes groups named ``spare-<token>`` and asks sandboxd to park a
   launcher in them (``park=`` request): it joins them and listens on
   ``run/sandboxd-spares/<helper version>/<token>.sock``.
2. A create claims a spare by renaming that socket into the sandbox's directory
   (``launcher-<token>.sock``): a rename succeeds for exactly one claimer, across threads
   and processes. The driver then renames the groups to the sandbox's id (cgroup v1
   allows renaming a group within its parent), writes the limits, and sends the create
   request to the claimed socket. The launcher builds the sandbox as usual and exits
   without leaving the groups.
3. Whatever a crash leaves is recognisable by name: a claimed socket in a sandbox's
   directory names its spare groups (the sandbox's teardown kills them); spare groups with
   no socket and no claim are removed by :meth:`Spares.sweep`.

A dead spare (a host reboot, a killed daemon) costs nothing but speed: connecting to its
socket fails and the create falls back to the launcher that joins the groups itself.

cgroup v2 cannot rename groups, so spares are used on v1 only; on v2 the same end is
reached without them: sandboxd creates each sandbox in its group with ``CLONE_INTO_CGROUP``
(``Cgroups.clone_into``), and nothing migrates.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

from e2bfacade.runtime.local.cgroups import SPARE_PREFIX, Cgroups
from e2bfacade.runtime.local.state import Layout

log = logging.getLogger(__name__)

CLAIM_PREFIX = "launcher-"


class Spares:
    def __init__(
        self,
        layout: Layout,
        cgroups: Cgroups,
        daemon: Callable[[], Path],
        target: int,
        version: str,
    ) -> None:
        self.layout = layout
        self.cgroups = cgroups
        self.daemon = daemon
        self.target = target if cgroups.version == 1 else 0
        # Under the daemon's "sandboxd-" prefix: what finds the daemon by its command line
        # (the title of a parked launcher names its socket) finds the spares too.
        # Per helper version: after an upgrade, a spare the old binary parked must never
        # serve a create (its agent would lack what the new service asks of it); sweep()
        # ends those, as spares no one can claim.
        self.dir = layout.root / "run" / "sandboxd-spares" / version
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.closed = False

    def ready(self) -> list[Path]:
        return sorted(self.dir.glob("*.sock"))

    def claim(self, sandbox_dir: Path) -> Path | None:
        """Take a parked launcher for the sandbox of ``sandbox_dir``: its socket, moved into
        that directory, or None when there is none."""
        if not self.target:
            return None
        for sock in self.ready():
            claimed = sandbox_dir / f"{CLAIM_PREFIX}{sock.stem}.sock"
            try:
                os.rename(sock, claimed)
            except FileNotFoundError:
                continue  # another create took it first
            return claimed
        return None

    @staticmethod
    def group_of(claimed: Path) -> str:
        return SPARE_PREFIX + claimed.stem.removeprefix(CLAIM_PREFIX)

    def fill(self) -> int:
        """Park launchers until ``target`` are ready; returns how many were made. One
        filler at a time per runtime root (others return at once)."""
        made = 0
        with self.layout.locked("spares", "fill", blocking=False) as got:
            if not got:
                return 0
            for sock in self.ready():  # dead ones first (a reboot, a killed daemon)
                group = SPARE_PREFIX + sock.stem
                if not self.cgroups.pids(group):
                    sock.unlink(missing_ok=True)
                    self.discard_group(group)
            while not self.closed and len(self.ready()) < self.target:
                if not self._park():
                    break
                made += 1
        return made

    def _park(self) -> bool:
        group = SPARE_PREFIX + secrets.token_hex(6)
        path = self.dir / f"{group.removeprefix(SPARE_PREFIX)}.sock"
        self.cgroups.make_group(group)
        request = [f"park={path}", *(f"cgroup={p}" for p in self.cgroups.procs_files(group))]
        payload = b"".join(item.encode() + b"\0" for item in request) + b"\0"
        reply = b""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(str(self.daemon()))
                s.sendall(payload)
                while not reply.endswith(b"\n"):
                    chunk = s.recv(256)
                    if not chunk:
                        break
                    reply += chunk
        except OSError as exc:
            reply = str(exc).encode()
        if reply.startswith(b"OK parked"):
            return True
        log.warning("could not park a spare launcher: %s", reply.decode(errors="replace"))
        self.discard_group(group)
        path.unlink(missing_ok=True)
        return False

    def discard_group(self, group: str) -> None:
        if self.cgroups.exists(group):
            self.cgroups.kill_all(group)
            self.cgroups.wait_empty(group)
            self.cgroups.remove(group)

    def sweep(self, claimed: Callable[[], set[str]], names: set[str] | None = None) -> list[str]:
        """Remove spare groups whose launcher is gone (or never parked) and that no sandbox
        has claimed (``claimed()``: the groups named by claims in sandbox directories,
        read after the groups are listed, so a claim made meanwhile is seen). ``names``: a
        listing of the groups (Cgroups.names) made before this call, else one is made."""
        removed: list[str] = []
        with self.layout.locked("spares", "fill", blocking=False) as got:
            if not got:
                return removed  # a filler is between making a group and parking in it
            groups = self.cgroups.spare_groups(names)

            def sock_of(group: str) -> Path:
                return self.dir / f"{group.removeprefix(SPARE_PREFIX)}.sock"

            idle = [g for g in groups if not (sock_of(g).exists() and self.cgroups.pids(g))]
            # Only asked when some group has no parked launcher (a walk of every sandbox).
            taken = claimed() if idle else set()
            for group in idle:
                if group in taken:
                    continue
                sock = sock_of(group)
                self.discard_group(group)
                sock.unlink(missing_ok=True)
                removed.append(group)
            for sock in self.ready():
                if not self.cgroups.exists(SPARE_PREFIX + sock.stem):
                    sock.unlink(missing_ok=True)
        return removed

    def discard(self) -> None:
        """Stop filling and end every parked launcher (a runtime being torn down)."""
        self.closed = True
        with self.layout.locked("spares", "fill"):
            for group in self.cgroups.spare_groups():
                self.discard_group(group)
            for sock in self.ready():
                with contextlib.suppress(FileNotFoundError):
                    sock.unlink()
