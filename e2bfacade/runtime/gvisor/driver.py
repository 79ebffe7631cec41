"""The ``gvisor`` driver: each sandbox in gVisor (Debian's ``runsc``), a user-space kernel
between the guest and the host's, whose checkpoint and restore keep a paused sandbox's
memory on disk, and give snapshots and forks that carry running processes.

It is the local driver (``e2bfacade/runtime/local/``) with another launcher: the same
images and layers, disks, records, id slots, volumes, network rules and guest agent, and
the same lifecycle steps, of which it replaces those that start and stop processes
(:meth:`launch`, :meth:`end_processes`, :meth:`pause_memory`, :meth:`resume_memory`,
:meth:`park`) — docs/runtime.md, "The gVisor driver", says what differs for a guest.

A sandbox's directory, beside the local driver's ``state.json`` and ``disk/``:

```
rootfs/       its root tree, mounted on the host while it runs (bundle.py)
bundle/       its OCI bundle; helper/ the agent's binary, mounted read-only in the guest
checkpoint/   while paused with its memory: gVisor's image of it (runsc checkpoint)
```
"""

from __future__ import annotations

import builtins
import contextlib
import ipaddress
import os
import shutil
import socket
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from e2bfacade.runtime.base import (
    Capability,
    ImageInfo,
    LimitExceeded,
    PauseMode,
    RuntimeBusy,
    RuntimeConflict,
    RuntimeUnavailable,
    SandboxRuntimeError,
    SandboxSpec,
    SandboxState,
    check_id,
)
from e2bfacade.runtime.gvisor import bundle, link
from e2bfacade.runtime.gvisor.guest import GvisorGuest
from e2bfacade.runtime.gvisor.runsc import Runsc, RunscError
from e2bfacade.runtime.local import build
from e2bfacade.runtime.local.driver import LocalRuntime
from e2bfacade.runtime.local.launcher import launch
from e2bfacade.runtime.local.net.network import digest_of
from e2bfacade.runtime.local.net.rules import Link
from e2bfacade.runtime.local.record import LocalSandboxInfo, Parked, SandboxRecord
from e2bfacade.runtime.local.state import proc_starttime
from e2bfacade.runtime.local.storage import disks, trees
from e2bfacade.runtime.local.storage.image_meta import ImageMeta, host_binds_of
from e2bfacade.runtime.local.storage.volumes import HostMount

AGENT_WAIT = 10.0  # the agent listens within ~0.1 s of the start; a create fails past this
CHECKPOINT_TRIES = 5  # a connection the guest had open blocks a checkpoint until it is reset
CHECKPOINT = "checkpoint"
PID_FILE = "pid"  # in the bundle: runsc's sandbox process, the sandbox's init on the host


def host_tasks(pids_max: int) -> int:
    """The host tasks a sandbox of ``pids_max`` processes may have: gVisor keeps no count of
    the guest's processes that a limit could bind (the spec's pids limit is not enforced by
    this runsc), and each guest process costs the host about two tasks (its address space's
    stub and a thread, measured: 200 sleeping processes, 447 tasks), beside the sentry's and
    the gofer's own threads. A guest past this is killed as a whole (its sandbox comes
    back paused with its files, as after a crash); the host's tasks stay bounded."""
    return 3 * pids_max + 128


class GvisorRuntime(LocalRuntime):
    name = "gvisor"
    # capabilities_for is the local driver's: with networking, internet access and rules.
    capabilities = LocalRuntime.capabilities | {Capability.MEMORY_SNAPSHOTS}

    def __init__(
        self, root: Path, *args: Any, spares: int = 2, warm: int = 0, **options: Any
    ) -> None:
        """The local driver's options; ``spares`` counts pooled disks only (runsc is the
        launcher: no spare launchers) and ``warm`` is ignored (no pool of started
        sandboxes: a create boots in ~0.3 s)."""
        self.runsc = Runsc(root / "runsc")  # RuntimeUnavailable without runsc, before anything
        super().__init__(root, *args, spares=0, warm=0, **options)
        self.disk_pool.target = spares
        self._digest = digest_of(root)[:8]
        cidr = self.network.config.cidr if self.network is not None else None
        link.ensure_guard(ipaddress.IPv4Network(cidr) if cidr else None)

    # ------------------------------------------------------------------------- pieces
    @property
    def helper(self) -> Path:
        """The runtime's compiled helper (the guest agent and init, the keeper)."""
        return build.ensure_binary(self.root)

    def cid(self, sandbox_id: str) -> str:
        """The sandbox's container id for runsc: unique on the host (runsc names its
        control socket after it, host-wide), so it carries the root's digest."""
        return f"{self._digest}-{sandbox_id}"

    def disk_id_base(self, id_base: int) -> int:
        return 0  # the guest's ids are stored as they are (bundle.py)

    def guest_ranges(self) -> builtins.list[ipaddress.IPv4Network]:
        """The root's network's range and its share of the isolated links (a sandbox made
        before networking was configured keeps an isolated link while it lives)."""
        return [*super().guest_ranges(), link.isolated_range(self.layout.id_block)]

    def link_of(self, sandbox_id: str) -> Link:
        """The sandbox's link: its network slot's, or an isolated one (link.py)."""
        slot = self.layout.slot_of(sandbox_id)
        id_base = self.layout.id_base_of(sandbox_id)
        if slot is None or id_base is None:
            raise RuntimeUnavailable(f"sandbox {sandbox_id} holds no id range")
        return self.network.link(slot) if self.network is not None else link.isolated_link(id_base)

    def _stage(self, record: SandboxRecord, chain: builtins.list[ImageMeta],
               volumes: builtins.list[HostMount]) -> Path:  # fmt: skip
        """Everything a start or a restore of the sandbox needs before runsc: its network
        rules, link, root tree, bundle and groups. Returns the bundle."""
        sid, d = record.sandbox_id, self.layout.sandbox_dir(record.sandbox_id)
        sandbox_link = self.link_of(sid)
        slot = self.layout.slot_of(sid)
        if self.network is not None and record.network is not None and slot is not None:
            self.network.apply(slot, sid, record.network)  # rules first, then the link
        netns = link.make(sandbox_link)
        layers = [self.images.layer(m.image_id) for m in chain]
        disks.ensure_mounted(d)
        bundle.mount_root(d, layers, host_binds_of(chain), volumes)
        helper = bundle.helper_dir(d, self.helper)
        self.cgroups.create(
            sid, cpu_count=record.cpu_count, memory_mb=record.memory_mb,
            pids_max=host_tasks(record.pids_max),
        )  # fmt: skip
        self.runsc.delete(self.cid(sid))  # a container a crash left under the id
        (d / "bundle" / PID_FILE).unlink(missing_ok=True)  # the last boot's
        return bundle.write(
            d, hostname=record.hostname or sid, netns=netns, helper=helper,
            agent_port=link.AGENT_PORT,
        )  # fmt: skip

    def _started(self, record: SandboxRecord) -> LocalSandboxInfo:
        """Commit the running container's sandbox process as the record's init."""
        sid = record.sandbox_id
        try:  # the sandbox process's pid, as runsc wrote it (--pid-file)
            pid = int((self.layout.sandbox_dir(sid) / "bundle" / PID_FILE).read_text())
        except (OSError, ValueError):
            pid = 0
        start = proc_starttime(pid) if pid > 0 else None
        if start is None:
            raise RuntimeBusy(f"sandbox {sid} stopped right after it started")
        self._wait_agent(sid)
        launched = record.replace(init_pid=pid, init_start=start, booted_at=self.now(), parked=None)
        launched.save(self.layout.sandbox_dir(sid))  # the commit point: from here it runs
        return self.info(launched)

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
    def launch(self, record: SandboxRecord, chain: builtins.list[ImageMeta]) -> LocalSandboxInfo:
        """Start the sandbox: a new kernel, or, for the first start of a sandbox made from a
        memory snapshot, that snapshot's processes restored (then given its own name)."""
        sid = record.sandbox_id
        first = record.booted_at == 0 and record.parked is None
        memory = self.layout.image_dir(chain[0].image_id) / CHECKPOINT
        restore = first and self.restores_processes(chain)
        with self.volumes.held(record.volume_mounts) as volumes:
            bundle_dir = self._stage(record, chain, volumes)
            try:
                if restore:
                    self._restore(sid, memory, bundle_dir)
                    name = record.hostname or sid  # the copy's own, not its source's
                    helper = f"{bundle.HELPER_DIR}/sandboxd"
                    self.runsc.run("exec", "--cap", "CAP_SYS_ADMIN", self.cid(sid), helper,
                                   "hostname", name)  # fmt: skip
                else:
                    self.runsc.run("create", "--bundle", str(bundle_dir),
                                   f"--pid-file={bundle_dir / PID_FILE}", self.cid(sid),
                                   network=True, cgroup_procs=self.cgroups.procs_files(sid),
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
            cgroup_procs=self.cgroups.procs_files(sandbox_id),
        )  # fmt: skip

    def restores_processes(self, chain: builtins.list[ImageMeta]) -> bool:
        return chain[0].memory

    def end_processes(self, name: str) -> None:
        """The container (sentry, gofer) and whatever is left in its groups, then its link
        and its root tree."""
        # Its processes first, all at once (SIGKILL to its groups): a runsc delete of a
        # checkpointed container waits over a second for its sandbox process to leave.
        launch.end_processes(self, name)
        with contextlib.suppress(SandboxRuntimeError):
            self.runsc.delete(self.cid(name))
        with contextlib.suppress(RuntimeUnavailable):
            link.remove(self.link_of(name))
        bundle.unmount_root(self.layout.sandbox_dir(name))

    def park(self, record: SandboxRecord, reason: str | None) -> SandboxRecord:
        """As the local driver parks it; a memory image it kept goes too (a cold boot, or
        a filesystem pause of a memory-paused sandbox, drops its memory)."""
        parked = super().park(record, reason)
        shutil.rmtree(self.layout.sandbox_dir(record.sandbox_id) / CHECKPOINT, ignore_errors=True)
        return parked

    def pause_memory(self, record: SandboxRecord) -> SandboxRecord:
        """Checkpoint the sandbox's processes and memory to its directory, then end them:
        nothing of it stays in memory, and a host restart keeps it. Connections into it
        are reset first (gVisor cannot save a connected endpoint; E2B cuts them too).
        Returns its record, paused."""
        sid, d = record.sandbox_id, self.layout.sandbox_dir(record.sandbox_id)
        image = d / CHECKPOINT
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
                break
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
        parked = super().park(record, None)  # processes, groups, link, rules, root; disk synced
        paused = parked.replace(parked=Parked(None, time.time(), memory=True))
        paused.save(d)
        return paused

    def resume_memory(self, record: SandboxRecord) -> None:
        """Restore the checkpointed sandbox: its processes continue where they were. On
        failure it stays paused with its memory image, and RuntimeBusy says why."""
        sid, d = record.sandbox_id, self.layout.sandbox_dir(record.sandbox_id)
        chain = self.images.chain(record.image_id)
        try:
            with self.volumes.held(record.volume_mounts) as volumes:
                bundle_dir = self._stage(record, chain, volumes)
                self._restore(sid, d / CHECKPOINT, bundle_dir)
            self._started(record)
        except BaseException as exc:
            self.end_processes(sid)
            if isinstance(exc, SandboxRuntimeError | OSError):
                why = exc.message if isinstance(exc, SandboxRuntimeError) else str(exc)
                raise RuntimeBusy(f"sandbox {sid} did not resume: {why}") from exc
            raise
        shutil.rmtree(d / CHECKPOINT, ignore_errors=True)

    def snapshot(self, sandbox_id: str, image_id: str, *, memory: bool = False) -> ImageInfo:
        """With ``memory``: its files and a checkpoint of its processes, taken while it is
        checkpointed (so the two agree); a running sandbox is paused for that moment and
        restored after, its connections reset as by a pause."""
        if not memory:
            return super().snapshot(sandbox_id, image_id)
        check_id(image_id, "image id")
        with self.layout.locked("sandbox", sandbox_id):
            record, info = self._require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
            if self.images.exists(image_id):
                return self.images.info(image_id)
            if record.volume_mounts:
                raise RuntimeConflict(
                    f"sandbox {sandbox_id} has volumes: its memory cannot be snapshotted "
                    "(a copy would not have them); snapshot it with memory false"
                )
            if info.pause_mode is PauseMode.FILESYSTEM:
                raise RuntimeConflict(
                    f"sandbox {sandbox_id} is paused without its memory: there is none to "
                    "snapshot; snapshot it with memory false, or resume it first"
                )
            running = info.state is SandboxState.RUNNING
            paused = self.pause_memory(record) if running else record
            d = self.layout.sandbox_dir(sandbox_id)

            def make(tmp: Path) -> ImageMeta:
                (tmp / "rootfs").rmdir()
                try:
                    trees.copy_layer(
                        d / disks.MOUNT / "upper", tmp / "rootfs", max_bytes=self.snapshot_max_bytes
                    )
                except trees.TreeTooLarge:
                    raise LimitExceeded(
                        f"sandbox {sandbox_id} holds more than the snapshot limit of "
                        f"{self.snapshot_max_bytes >> 20} MiB of written files"
                    ) from None
                (tmp / CHECKPOINT).mkdir()
                for entry in os.scandir(d / CHECKPOINT):  # the same file system: links
                    os.link(entry.path, tmp / CHECKPOINT / entry.name)
                return ImageMeta(image_id, parent=info.image_id, memory=True)

            try:
                return self.images.publish(image_id, make)
            finally:
                if running:
                    self.resume_memory(paused)

    def guest(self, sandbox_id: str) -> GvisorGuest:
        record, info = self._require(sandbox_id, SandboxState.RUNNING)
        d = self.layout.sandbox_dir(sandbox_id)
        return GvisorGuest(
            record, info, d / "rootfs", self.link_of(sandbox_id),
            lambda: self.cgroups.is_frozen(sandbox_id),
        )  # fmt: skip

    def sweep(self, seen_live: Collection[str] = ()) -> builtins.list[str]:
        """The local driver's sweep, then runsc's state of containers whose sandbox is
        gone (a crash between the steps of a kill)."""
        reaped = super().sweep(seen_live)
        prefix = f"{self._digest}-"
        for cid in self.runsc.containers():
            sid = cid.removeprefix(prefix)
            if not cid.startswith(prefix) or sid in seen_live:
                continue
            with self.layout.locked("sandbox", sid, blocking=False) as got:
                if got and self.layout.read_state(sid) is None:
                    with contextlib.suppress(SandboxRuntimeError):
                        self.runsc.delete(cid)
        return reaped

    # ------------------------------------------------------------------------- pools
    def keep_warm(self, spec: SandboxSpec) -> None:
        """No pool of started sandboxes (the module's header)."""

    def warm_pools(self, specs: Iterable[SandboxSpec]) -> None:
        self.warm.keep_only([])


def installed() -> bool:
    """Whether runsc is on this host (the contract suite runs the driver where it is)."""
    return shutil.which("runsc") is not None or os.path.exists("/usr/bin/runsc")
