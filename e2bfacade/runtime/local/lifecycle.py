"""One sandbox's lifecycle on the host runtime, each step under the sandbox's id lock (held
by the caller, driver.py): its state read from its record (census.py), its launch and
commit, cold boot, park, pause and resume with its memory, its end — the host layer's
steps around the sandboxer's (sandboxer.py), which it is given with the host's parts."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from e2bfacade.runtime.base import (
    CRASH_REASON,
    ImageInfo,
    ImageNotFound,
    NetworkPolicy,
    PauseMode,
    RuntimeBusy,
    RuntimeConflict,
    SandboxNotFound,
    SandboxRuntimeError,
    SandboxSpec,
    SandboxState,
    StartCommand,
)
from e2bfacade.runtime.local import census, snapshot
from e2bfacade.runtime.local.guest.handle import LocalGuest
from e2bfacade.runtime.local.launcher import launch
from e2bfacade.runtime.local.parts import HostParts
from e2bfacade.runtime.local.record import LocalSandboxInfo, Parked, SandboxRecord
from e2bfacade.runtime.local.sandboxer import Init, Sandboxer
from e2bfacade.runtime.local.storage import disks
from e2bfacade.runtime.local.storage.image_meta import ImageMeta, start_of
from e2bfacade.runtime.start import run_kept


class Lifecycle:
    """The steps of a sandbox's life that the host runtime's operations are made of."""

    def __init__(self, parts: HostParts, sandboxer: Sandboxer) -> None:
        self.parts = parts
        self.sandboxer = sandboxer

    def info(self, record: SandboxRecord, adopted: bool = False) -> LocalSandboxInfo:
        return census.status_of(self.parts.layout, self.parts.cgroups, record, adopted)

    def require(
        self, sandbox_id: str, *allowed: SandboxState
    ) -> tuple[SandboxRecord, LocalSandboxInfo]:
        record = self.parts.layout.read_state(sandbox_id)
        if record is None:
            raise SandboxNotFound(f"sandbox {sandbox_id} does not exist")
        info = self.info(record)
        if info.state not in allowed:
            raise RuntimeConflict(f"sandbox {sandbox_id} is {info.state}")
        return record, info

    def guest(self, sandbox_id: str) -> LocalGuest:
        """The running sandbox's guest side, resolved once: one read of its record (init
        identity, id base, default user, env vars) and of its state; the sandboxer says
        how the host reaches it."""
        record, info = self.require(sandbox_id, SandboxState.RUNNING)
        frozen = lambda: self.parts.cgroups.is_frozen(sandbox_id)  # noqa: E731
        return LocalGuest(record, info, self.sandboxer.reach(record, frozen), frozen)

    def adopt(self, record: SandboxRecord, spec: SandboxSpec) -> LocalSandboxInfo | None:
        """A create of an id that has a record: the sandbox it names, when it is not dead and
        was made from the same image with the same volumes (RuntimeConflict otherwise); None
        when it is dead (the caller makes it afresh). Caller holds the id's lock."""
        info = self.info(record, adopted=True)
        if info.state is SandboxState.DEAD:
            return None
        if info.image_id != spec.image_id:
            raise RuntimeConflict(
                f"sandbox {spec.sandbox_id} exists from image {info.image_id}, not {spec.image_id}"
            )
        if record.volume_mounts != tuple(spec.volume_mounts):
            raise RuntimeConflict(f"sandbox {spec.sandbox_id} exists with other volume mounts")
        if info.pause_mode is PauseMode.FILESYSTEM:
            # Made, then its processes ended before its create was answered (a crash): it
            # runs again on its files, as its create asked.
            booted = self.boot(record)
            self.parts.refill.after_create(spec.disk_mb)
            return dataclasses.replace(booted, adopted=True)
        return info

    def make(
        self, spec: SandboxSpec, chain: Sequence[ImageMeta], warm_key: str | None
    ) -> LocalSandboxInfo:
        """A new sandbox's directory, disk and record (launch.prepare), launched; ``warm_key``:
        a pool sandbox's shape. Caller destroys what a failure leaves."""
        record = launch.prepare(
            self.parts, spec, chain, disk_owner=self.sandboxer.disk_owner, warm_key=warm_key,
            now=time.time(),
        )  # fmt: skip
        return self.launch(record, chain)

    def launch(self, record: SandboxRecord, chain: Sequence[ImageMeta]) -> LocalSandboxInfo:
        """Start the prepared sandbox (the sandboxer's start) with its volumes held, and
        write its record with its init: the commit point. A create and a cold boot alike."""
        with self.parts.volumes.held(record.volume_mounts) as volumes:
            return self._commit(record, self.sandboxer.start(record, chain, volumes))

    def _commit(self, record: SandboxRecord, init: Init) -> LocalSandboxInfo:
        launched = record.replace(
            init_pid=init.pid, init_start=init.start, booted_at=time.time(), parked=None
        )
        launched.save(self.parts.layout.sandbox_dir(record.sandbox_id))  # from here it runs
        return self.info(launched)

    def boot(self, record: SandboxRecord) -> LocalSandboxInfo:
        """Cold-boot a sandbox that kept only its files: a new init on its disk, its id
        range, host name, env vars, access tokens and network rules, then the template's
        start command. Caller holds the id's lock. On failure it is left as it was, parked
        with its files, and RuntimeBusy (or RuntimeConflict) says why."""
        sid = record.sandbox_id
        if self.parts.layout.id_base_of(sid) != record.id_base:
            raise RuntimeConflict(f"sandbox {sid} lost its id range: it cannot boot")
        reason = record.parked.reason if record.parked is not None else CRASH_REASON
        parked = self.park(record, reason)  # whatever a crash left of its processes goes
        try:
            chain = self.parts.images.chain(record.image_id)
            d = self.parts.layout.sandbox_dir(sid)
            disks.ensure_mounted(d)
            (d / "agent.sock").unlink(missing_ok=True)
            info = self.launch(parked, chain)
            if (start := start_of(chain)) is not None:
                self.run_start(sid, start)
            return info
        except BaseException as exc:
            self.park(parked, reason)
            if isinstance(exc, ImageNotFound):
                raise RuntimeConflict(f"sandbox {sid} cannot boot: {exc.message}") from exc
            if isinstance(exc, (SandboxRuntimeError, OSError)):
                why = exc.message if isinstance(exc, SandboxRuntimeError) else str(exc)
                raise RuntimeBusy(f"sandbox {sid} did not boot: {why}") from exc
            raise

    def run_start(self, sandbox_id: str, start: StartCommand) -> None:
        """Run the template's start command in the running sandbox; what it and the ready
        command write is kept in its directory (``start_output``), bounded, whether it comes
        up or not (a failed cold boot leaves it parked, with its output to read)."""
        run_kept(self.guest(sandbox_id), start, self.parts.layout.sandbox_dir(sandbox_id))

    def end_processes(self, name: str) -> None:
        """Kill every process of the sandbox (or pool sandbox) ``name`` — all at once, with
        its groups — then what else holds it (the sandboxer's end)."""
        launch.end_processes(self.parts.cgroups, name)
        self.sandboxer.end(name)

    def park(
        self, record: SandboxRecord, reason: str | None, *, keep_memory: bool = False
    ) -> SandboxRecord:
        """End its processes and keep its files (launch.park); what the sandboxer saved of
        its memory goes too, unless ``keep_memory`` (a pause that checkpointed it)."""
        parked = launch.park(self.parts, self.end_processes, record, reason)
        if not keep_memory:
            self.sandboxer.drop_memory(record.sandbox_id)
        return parked

    def pause_memory(self, record: SandboxRecord) -> SandboxRecord:
        """Freeze its processes, or, with a sandboxer that checkpoints, save them to its
        directory and end them: parked with its memory (a host restart keeps it). Returns
        its record as paused."""
        if not self.sandboxer.checkpoints:
            self.sandboxer.freeze(record)
            return record
        self.sandboxer.checkpoint(record)
        parked = self.park(record, None, keep_memory=True)  # processes, groups, link, rules
        paused = parked.replace(parked=Parked(None, time.time(), memory=True))
        paused.save(self.parts.layout.sandbox_dir(record.sandbox_id))
        return paused

    def resume_memory(self, record: SandboxRecord) -> None:
        """Thaw a frozen sandbox, or restore a checkpointed one: its processes continue where
        they were. A restore that fails leaves it paused with its memory, and RuntimeBusy
        says why."""
        if not self.sandboxer.checkpoints:
            self.sandboxer.thaw(record)
            return
        sid = record.sandbox_id
        try:
            with self.parts.volumes.held(record.volume_mounts) as volumes:
                self._commit(record, self.sandboxer.restore(record, volumes))
        except BaseException as exc:
            self.end_processes(sid)
            if isinstance(exc, SandboxRuntimeError | OSError):
                why = exc.message if isinstance(exc, SandboxRuntimeError) else str(exc)
                raise RuntimeBusy(f"sandbox {sid} did not resume: {why}") from exc
            raise
        self.sandboxer.drop_memory(sid)

    def destroy(self, sandbox_id: str) -> bool:
        """Kill the sandbox and remove everything of it (:func:`.launcher.launch.destroy`).
        Caller holds the id's lock. Returns whether anything existed."""
        return launch.destroy(self.parts, self.end_processes, sandbox_id)

    def snapshot(self, sandbox_id: str, image_id: str, *, memory: bool = False) -> ImageInfo:
        """Capture the sandbox's files as image ``image_id`` (snapshot.py), idempotent by
        that id; with ``memory`` (MEMORY_SNAPSHOTS), a checkpoint of its processes too, taken
        while it is checkpointed (so the two agree): a running sandbox is paused for that
        moment and restored after, its connections reset as by a pause. Caller holds the
        id's lock."""
        record, info = self.require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
        if self.parts.images.exists(image_id):
            return self.parts.images.info(image_id)
        if not memory:
            shift = -self.sandboxer.disk_owner(record.id_base)
            return snapshot.capture(self.parts, record, info, image_id, id_shift=shift)
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
        try:
            return snapshot.capture_memory(
                self.parts, paused, info, image_id, copy_memory=self.sandboxer.copy_memory
            )
        finally:
            if running:
                self.resume_memory(paused)

    def update_network(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Replace the sandbox's egress rules, in one step: connections already open stay
        open (as E2B), new ones follow the new rules. A parked sandbox's are applied when
        it boots. Caller holds the id's lock."""
        record, info = self.require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
        slot = self.parts.layout.slot_of(sandbox_id)
        if self.parts.network is None or slot is None or record.network is None:
            raise RuntimeConflict(f"sandbox {sandbox_id} has no network to update")
        if info.pause_mode is not PauseMode.FILESYSTEM:
            self.parts.network.apply(slot, sandbox_id, policy)
        record.replace(network=policy).save(self.parts.layout.sandbox_dir(sandbox_id))
