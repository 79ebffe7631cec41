"""The ``gvisor`` driver's sandboxer (local/sandboxer.py): each sandbox in gVisor (Debian's
``runsc``), a user-space kernel between the guest and the host's, whose checkpoint and
restore keep a paused sandbox's memory on disk, and give snapshots and forks that carry
running processes.

The host runtime around it is the one the local driver has too (the same images and
layers, disks, records, id slots, volumes, network rules and guest agent); this does what
starts, pauses and ends processes, and says how the host reaches the guest (its agent on
the sandbox's link, its files through the root tree mounted on the host, its ports through
its address: guest.py) — docs/runtime.md, "The gVisor driver", says what differs for a
guest.

A sandbox's directory, beside the host's ``state.json`` and ``disk/``:

```
rootfs/       its root tree, mounted on the host while it runs (bundle.py)
bundle/       its OCI bundle; helper/ the agent's binary, mounted read-only in the guest
checkpoint/   while paused with its memory: gVisor's image of it (runsc checkpoint)
```
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from e2bfacade.runtime.base import (
    Capability,
    RuntimeBusy,
    RuntimeUnavailable,
    SandboxRuntimeError,
)
from e2bfacade.runtime.gvisor import bundle, link
from e2bfacade.runtime.gvisor.guest import GvisorReach
from e2bfacade.runtime.gvisor.runsc import Runsc, RunscError
from e2bfacade.runtime.local import build
from e2bfacade.runtime.local.net.network import digest_of
from e2bfacade.runtime.local.net.rules import Link
from e2bfacade.runtime.local.record import SandboxRecord
from e2bfacade.runtime.local.sandboxer import HostParts, Init
from e2bfacade.runtime.local.state import proc_starttime
from e2bfacade.runtime.local.storage import disks
from e2bfacade.runtime.local.storage.image_meta import ImageMeta, host_binds_of
from e2bfacade.runtime.local.storage.volumes import HostMount

AGENT_WAIT = 10.0  # the agent listens within ~0.1 s of the start; a create fails past this
CHECKPOINT_TRIES = 5  # a connection the guest had open blocks a checkpoint until it is reset
CHECKPOINT = "checkpoint"
RUNSC_STATE = "runsc"  # in the root: runsc's --root, its containers' state
PID_FILE = "pid"  # in the bundle: runsc's sandbox process, the sandbox's init on the host


def host_tasks(pids_max: int) -> int:
    """The host tasks a sandbox of ``pids_max`` processes may have: gVisor keeps no count of
    the guest's processes that a limit could bind (the spec's pids limit is not enforced by
    this runsc), and each guest process costs the host about two tasks (its address space's
    stub and a thread, measured: 200 sleeping processes, 447 tasks), beside the sentry's and
    the gofer's own threads. A guest past this is killed as a whole (its sandbox comes
    back paused with its files, as after a crash); the host's tasks stay bounded."""
    return 3 * pids_max + 128


class GvisorSandboxer:
    name = "gvisor"
    state_dir: str | None = RUNSC_STATE
    capabilities = frozenset({Capability.MEMORY_SNAPSHOTS})
    # runsc is the launcher (no spare launchers); no pool of started sandboxes (a create
    # boots in ~0.3 s). Pooled disks stay (the host's).
    spare_launchers = False
    warm_pool = False
    checkpoints = True

    @staticmethod
    def preflight(root: Path) -> None:
        """RuntimeUnavailable without runsc, before the host makes anything of the root."""
        Runsc(root / RUNSC_STATE)

    def __init__(self, parts: HostParts) -> None:
        self.parts = parts
        self.runsc = Runsc(parts.root / RUNSC_STATE)
        self._digest = digest_of(parts.root)[:8]
        cidr = parts.network.config.cidr if parts.network is not None else None
        link.ensure_guard(ipaddress.IPv4Network(cidr) if cidr else None)

    # ------------------------------------------------------------------------- pieces
    @property
    def helper(self) -> Path:
        """The runtime's compiled helper (the guest agent and init, the keeper)."""
        return build.ensure_binary(self.parts.root)

    def cid(self, sandbox_id: str) -> str:
        """The sandbox's container id for runsc: unique on the host (runsc names its
        control socket after it, host-wide), so it carries the root's digest."""
        return f"{self._digest}-{sandbox_id}"

    def disk_owner(self, id_base: int) -> int:
        return 0  # the guest's ids are stored as they are (bundle.py)

    def guest_ranges(self) -> list[ipaddress.IPv4Network]:
        """Its share of the isolated links (a sandbox made before networking was configured
        keeps an isolated link while it lives)."""
        return [link.isolated_range(self.parts.layout.id_block)]

    def link_of(self, sandbox_id: str) -> Link:
        """The sandbox's link: its network slot's, or an isolated one (link.py)."""
        layout, network = self.parts.layout, self.parts.network
        slot = layout.slot_of(sandbox_id)
        id_base = layout.id_base_of(sandbox_id)
        if slot is None or id_base is None:
            raise RuntimeUnavailable(f"sandbox {sandbox_id} holds no id range")
        return network.link(slot) if network is not None else link.isolated_link(id_base)

    def _stage(
        self, record: SandboxRecord, chain: Sequence[ImageMeta], volumes: Sequence[HostMount]
    ) -> Path:
        """Everything a start or a restore of the sandbox needs before runsc: its network
        rules, link, root tree, bundle and groups. Returns the bundle."""
        p = self.parts
        sid, d = record.sandbox_id, p.layout.sandbox_dir(record.sandbox_id)
        sandbox_link = self.link_of(sid)
        slot = p.layout.slot_of(sid)
        if p.network is not None and record.network is not None and slot is not None:
            p.network.apply(slot, sid, record.network)  # rules first, then the link
        netns = link.make(sandbox_link)
        layers = [p.images.layer(m.image_id) for m in chain]
        disks.ensure_mounted(d)
        bundle.mount_root(d, layers, host_binds_of(chain), volumes)
        helper = bundle.helper_dir(d, self.helper)
        p.cgroups.create(
            sid, cpu_count=record.cpu_count, memory_mb=record.memory_mb,
            pids_max=host_tasks(record.pids_max),
        )  # fmt: skip
        self.runsc.delete(self.cid(sid))  # a container a crash left under the id
        (d / "bundle" / PID_FILE).unlink(missing_ok=True)  # the last boot's
        return bundle.write(
            d, hostname=record.hostname or sid, netns=netns, helper=helper,
            agent_port=link.AGENT_PORT,
        )  # fmt: skip

    def _started(self, record: SandboxRecord) -> Init:
        """The running container's sandbox process (the record's init), once its agent
        answers."""
        sid = record.sandbox_id
        try:  # the sandbox process's pid, as runsc wrote it (--pid-file)
            pid = int((self.parts.layout.sandbox_dir(sid) / "bundle" / PID_FILE).read_text())
        except (OSError, ValueError):
            pid = 0
        start = proc_starttime(pid) if pid > 0 else None
        if start is None:
            raise RuntimeBusy(f"sandbox {sid} stopped right after it started")
        self._wait_agent(sid)
        return Init(pid, start)

    def _wait_agent(self, sandbox_id: str) -> None:
        address = (self.link_of(sandbox_id).guest_ip, link.AGENT_PORT)
        deadline = time.monotonic() + AGENT_WAIT
        while True:
            try:
                # Hung up at once, before the agent answers anything: a request-less connection.
                socket.create_connection(address, timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeBusy(f"sandbox {sandbox_id}'s agent did not come up") from None
                time.sleep(0.01)

    # ---------------------------------------------------------------------- lifecycle
    def start(
        self, record: SandboxRecord, chain: Sequence[ImageMeta], volumes: Sequence[HostMount]
    ) -> Init:
        """A new kernel, or, for the first start of a sandbox made from a memory snapshot,
        that snapshot's processes restored (then given its own name)."""
        sid = record.sandbox_id
        first = record.booted_at == 0 and record.parked is None
        memory = self.parts.layout.image_dir(chain[0].image_id) / CHECKPOINT
        bundle_dir = self._stage(record, chain, volumes)
        try:
            if first and chain[0].memory:
                self._restore(sid, memory, bundle_dir)
                name = record.hostname or sid  # the copy's own, not its source's
                helper = f"{bundle.HELPER_DIR}/sandboxd"
                self.runsc.run("exec", "--cap", "CAP_SYS_ADMIN", self.cid(sid), helper,
                               "hostname", name)  # fmt: skip
            else:
                self.runsc.run("create", "--bundle", str(bundle_dir),
                               f"--pid-file={bundle_dir / PID_FILE}", self.cid(sid),
                               network=True, cgroup_procs=self.parts.cgroups.procs_files(sid),
                               keeper=self.helper)  # fmt: skip
                self.runsc.run("start", self.cid(sid), network=True)
        except RunscError as exc:
            raise RuntimeBusy(exc.message) from exc
        return self._started(record)

    def _restore(self, sandbox_id: str, image: Path, bundle_dir: Path) -> None:
        """``runsc restore`` of ``image`` into the staged sandbox (its groups, its link)."""
        self.runsc.run(
            "restore", f"--image-path={image}", "--bundle", str(bundle_dir), "--detach",
            f"--pid-file={bundle_dir / PID_FILE}",
            self.cid(sandbox_id), network=True, keeper=self.helper,
            cgroup_procs=self.parts.cgroups.procs_files(sandbox_id),
        )  # fmt: skip

    def end(self, name: str) -> None:
        """The container's state (its processes, sentry and gofer, went with its groups,
        all at once: a runsc delete of a checkpointed container waits over a second for its
        sandbox process to leave), then its link and its root tree."""
        with contextlib.suppress(SandboxRuntimeError):
            self.runsc.delete(self.cid(name))
        with contextlib.suppress(RuntimeUnavailable):
            link.remove(self.link_of(name))
        bundle.unmount_root(self.parts.layout.sandbox_dir(name))

    def freeze(self, record: SandboxRecord) -> None:
        raise RuntimeBusy("the gvisor driver pauses with a checkpoint, not a freeze")

    def thaw(self, record: SandboxRecord) -> None:
        raise RuntimeBusy("the gvisor driver pauses with a checkpoint, not a freeze")

    def checkpoint(self, record: SandboxRecord) -> None:
        """Its processes and memory to its directory; the host ends them after. Connections
        into it are reset first (gVisor cannot save a connected endpoint; E2B cuts them
        too)."""
        sid = record.sandbox_id
        image = self.parts.layout.sandbox_dir(sid) / CHECKPOINT
        sandbox_link = self.link_of(sid)
        for attempt in range(CHECKPOINT_TRIES):
            shutil.rmtree(image, ignore_errors=True)
            image.mkdir(mode=0o700)
            link.cut_connections(sandbox_link)
            try:
                # Uncompressed: flate costs more time than the disk it saves (a 64 MiB heap of
                # random bytes: pause 0.40 -> 0.23 s, resume 0.50 -> 0.38 s).
                self.runsc.run("checkpoint", f"--image-path={image}", "--compression=none",
                               self.cid(sid))  # fmt: skip
                return
            except RunscError as exc:
                if (self.runsc.state(self.cid(sid)) or {}).get("status") != "running":
                    raise RuntimeBusy(f"sandbox {sid} could not be paused: {exc.message}") from exc
                if attempt == CHECKPOINT_TRIES - 1:
                    shutil.rmtree(image, ignore_errors=True)
                    raise RuntimeBusy(
                        f"sandbox {sid} could not be paused with its memory ({exc.message}): "
                        "a network connection it holds cannot be saved; try again"
                    ) from exc
                time.sleep(0.05 * 2**attempt)

    def restore(self, record: SandboxRecord, volumes: Sequence[HostMount]) -> Init:
        """The checkpointed sandbox restored: its processes continue where they were."""
        sid = record.sandbox_id
        chain = self.parts.images.chain(record.image_id)
        bundle_dir = self._stage(record, chain, volumes)
        self._restore(sid, self.parts.layout.sandbox_dir(sid) / CHECKPOINT, bundle_dir)
        return self._started(record)

    def drop_memory(self, sandbox_id: str) -> None:
        shutil.rmtree(self.parts.layout.sandbox_dir(sandbox_id) / CHECKPOINT, ignore_errors=True)

    def copy_memory(self, sandbox_id: str, image_dir: Path) -> None:
        (image_dir / CHECKPOINT).mkdir()
        source = self.parts.layout.sandbox_dir(sandbox_id) / CHECKPOINT
        for entry in os.scandir(source):  # the same file system: links
            os.link(entry.path, image_dir / CHECKPOINT / entry.name)

    def reach(self, record: SandboxRecord, frozen: Callable[[], bool]) -> GvisorReach:
        d = self.parts.layout.sandbox_dir(record.sandbox_id)
        return GvisorReach(record, d / "rootfs", self.link_of(record.sandbox_id), frozen)

    def sweep(self, seen_live: Collection[str]) -> None:
        """runsc's state of containers whose sandbox is gone (a crash between the steps of
        a kill)."""
        layout = self.parts.layout
        prefix = f"{self._digest}-"
        for cid in self.runsc.containers():
            sid = cid.removeprefix(prefix)
            if not cid.startswith(prefix) or sid in seen_live:
                continue
            with layout.locked("sandbox", sid, blocking=False) as got:
                if got and layout.read_state(sid) is None:
                    with contextlib.suppress(SandboxRuntimeError):
                        self.runsc.delete(cid)


def installed() -> bool:
    """Whether runsc is on this host (the contract suite runs the driver where it is)."""
    return shutil.which("runsc") is not None or os.path.exists("/usr/bin/runsc")
