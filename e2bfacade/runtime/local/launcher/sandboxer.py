"""The ``local`` driver's sandboxer (local/sandboxer.py): each sandbox in Linux namespaces
made by sandboxd, the C launcher (client.py is its wire) — a user namespace with its own
host id range, and pid, mount, uts, ipc, net and cgroup namespaces; an overlay root over
idmapped read-only image layers; seccomp; a reaping PID 1. A pause with memory freezes its
cgroups; its guest agent listens on a unix socket in its directory."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from e2bfacade.runtime.base import Capability, CreateRefused, RuntimeConflict
from e2bfacade.runtime.local import build, lxcfs
from e2bfacade.runtime.local.guest.reach import NamespaceReach
from e2bfacade.runtime.local.ids import ID_RANGE
from e2bfacade.runtime.local.launcher.client import Launcher
from e2bfacade.runtime.local.pools.spares import Spares
from e2bfacade.runtime.local.record import SandboxRecord
from e2bfacade.runtime.local.sandboxer import HostParts, Init
from e2bfacade.runtime.local.state import proc_starttime
from e2bfacade.runtime.local.storage.image_meta import ImageMeta, host_binds_of
from e2bfacade.runtime.local.storage.volumes import HostMount

# Mounts the launcher hands the init in one message (launcher/c/launcher.h MAX_FDS): the
# image's layers, the host binds, lxcfs's and the volumes.
MAX_FDS = 32


class NamespaceSandboxer:
    name = "local"
    state_dir: str | None = None
    capabilities: frozenset[Capability] = frozenset()
    spare_launchers = True
    warm_pool = True
    checkpoints = False

    @staticmethod
    def preflight(root: Path) -> None:
        """The host's own checks (host.check_supported) are all it needs."""

    def __init__(self, parts: HostParts) -> None:
        self.parts = parts
        root = parts.root
        self.launcher = Launcher(lambda: build.ensure_daemon(root), parts.cgroups)

    def disk_owner(self, id_base: int) -> int:
        return id_base  # its user namespace maps guest ids to the range's

    def guest_ranges(self) -> list[ipaddress.IPv4Network]:
        return []  # its guest side is reached through its namespaces, not an address

    def start(
        self, record: SandboxRecord, chain: Sequence[ImageMeta], volumes: Sequence[HostMount]
    ) -> Init:
        """The sandbox's init on its prepared directory and disk, in its groups: a launcher
        already in groups that become the sandbox's (pools/spares.py), or one that joins
        them itself (and waits for the kernel, on a quiet host)."""
        binds = host_binds_of(chain)
        mounts = len(chain) + len(binds) + 1 + len(record.volume_mounts)
        if mounts > MAX_FDS:
            raise CreateRefused(
                f"sandbox {record.sandbox_id} would need {mounts} mounts (image layers, host "
                f"binds and volumes), more than the {MAX_FDS} one sandbox may have"
            )
        p = self.parts
        sid, d = record.sandbox_id, p.layout.sandbox_dir(record.sandbox_id)
        link = None
        if p.network is not None and record.network is not None:
            # Rules first, then the link: the guest never has a moment of unfiltered egress.
            slot = (record.id_base - p.layout.id_block_base) // ID_RANGE
            p.network.apply(slot, sid, record.network)
            link = p.network.link(slot)
        launcher = p.spares.claim(d)
        spare = Spares.group_of(launcher) if launcher is not None else None
        if spare is not None and not p.cgroups.adopt(spare, sid):
            launcher = None
        p.cgroups.create(
            sid, cpu_count=record.cpu_count, memory_mb=record.memory_mb, pids_max=record.pids_max
        )
        # The C launcher's request: its wire format (launcher/c/launch.c), made here only.
        request = [
            f"rootfs={d / 'rootfs'}",
            "lower=" + ":".join(str(p.images.layer(m.image_id)) for m in chain),
            f"hostname={record.hostname or sid}",
            f"seccomp={build.ensure_seccomp(p.root)}",
            f"dir={d}",
            f"idbase={record.id_base}",
            *(f"bind={b}:{b}" for b in binds),
            *(f"volume={v.source}:{v.target}" for v in volumes),
            *(link.request() if link is not None else ()),
        ]
        proc_view = lxcfs.ensure(p.root)  # a live one at each launch: it may have died
        if proc_view is not None:
            request.append(f"lxcfs={proc_view}")
        pid = None
        if launcher is not None:
            pid = self.launcher.launch_spare(sid, launcher, request)
        if pid is None:
            # v2: born in its group (CLONE_INTO_CGROUP); v1: the launcher joins and leaves.
            into = p.cgroups.clone_into(sid)
            joins = (
                [f"cgroupdir={into}"]
                if into is not None
                else [
                    *(f"cgroup={f}" for f in p.cgroups.procs_files(sid)),
                    *(f"leave={f}" for f in p.cgroups.root_procs_files()),
                ]
            )
            pid = self.launcher.launch(request + joins)
        start = proc_starttime(pid)
        if start is None:
            raise CreateRefused(f"sandbox {sid} exited right after it started")
        return Init(pid, start)

    def end(self, name: str) -> None:
        """Nothing beyond its groups holds it: its link went with its network namespace."""

    def freeze(self, record: SandboxRecord) -> None:
        self.parts.cgroups.freeze(record.sandbox_id)
        self._link_up(record.sandbox_id, False)  # no packet in or out while frozen

    def thaw(self, record: SandboxRecord) -> None:
        self._link_up(record.sandbox_id, True)
        self.parts.cgroups.thaw(record.sandbox_id)

    def _link_up(self, sandbox_id: str, up: bool) -> None:
        slot = self.parts.layout.slot_of(sandbox_id)
        if self.parts.network is not None and slot is not None:
            self.parts.network.set_up(slot, up)

    def checkpoint(self, record: SandboxRecord) -> None:
        raise RuntimeConflict("the local driver pauses by freezing: it keeps no checkpoint")

    def restore(self, record: SandboxRecord, volumes: Sequence[HostMount]) -> Init:
        raise RuntimeConflict("the local driver pauses by freezing: it keeps no checkpoint")

    def drop_memory(self, sandbox_id: str) -> None:
        """It saves none."""

    def copy_memory(self, sandbox_id: str, image_dir: Path) -> None:
        raise RuntimeConflict("the local driver's snapshots capture files only")

    def reach(self, record: SandboxRecord, frozen: Callable[[], bool]) -> NamespaceReach:
        agent = self.parts.layout.sandbox_dir(record.sandbox_id) / "agent.sock"
        return NamespaceReach(record, agent)

    def sweep(self, seen_live: Collection[str]) -> None:
        """The host's sweep releases all it holds (groups, spares, slots)."""
