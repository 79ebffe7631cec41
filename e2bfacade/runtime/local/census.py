"""What a host runtime holds: each sandbox's state read from its record and its init (is it
alive, frozen, parked), and the census of them all the reconcile asks for every tick. Each
takes the root's layout and cgroups it reads, never the runtime."""

from __future__ import annotations

from e2bfacade.runtime.base import CRASH_REASON, Census, PauseMode, SandboxState
from e2bfacade.runtime.local.cgroups import Cgroups
from e2bfacade.runtime.local.record import LocalSandboxInfo, SandboxRecord
from e2bfacade.runtime.local.state import InitWatch, Layout, kill_pending, proc_starttime
from e2bfacade.runtime.local.storage import disks


def status_of(
    layout: Layout, cgroups: Cgroups, record: SandboxRecord, adopted: bool = False
) -> LocalSandboxInfo:
    """What the sandbox of ``record`` is now: running, paused (frozen, or parked: kept with
    its files only, for a reason or none), or dead."""
    mode, reason = None, None
    if record.parked is not None:
        state, reason = SandboxState.PAUSED, record.parked.reason
        mode = PauseMode.FULL if record.parked.memory else PauseMode.FILESYSTEM
    elif proc_starttime(record.init_pid) != record.init_start or (
        cgroups.is_frozen(record.sandbox_id) and kill_pending(record.init_pid)
    ):
        # Its processes ended without a pause (or, frozen, were killed: they die as soon
        # as a thaw lets them run): its files are kept (a pool sandbox's are no one's),
        # and it is paused until a resume cold-boots it, ending what is left of them.
        if not record.is_warm and disks.exists(layout.sandbox_dir(record.sandbox_id)):
            state, mode, reason = SandboxState.PAUSED, PauseMode.FILESYSTEM, CRASH_REASON
        else:
            state = SandboxState.DEAD
    elif cgroups.is_frozen(record.sandbox_id):
        state, mode = SandboxState.PAUSED, PauseMode.FULL
    else:
        state = SandboxState.RUNNING
    return LocalSandboxInfo(
        sandbox_id=record.sandbox_id,
        image_id=record.image_id,
        state=state,
        cpu_count=record.cpu_count,
        memory_mb=record.memory_mb,
        pids_max=record.pids_max,
        created_at=record.created_at,
        adopted=adopted,
        envd_access_token=record.envd_access_token,
        traffic_access_token=record.traffic_access_token,
        mask_request_host=record.mask_request_host,
        default_user=record.default_user,
        env_vars=dict(record.env_vars),
        pause_mode=mode,
        pause_reason=reason,
        init_pid=record.init_pid,
        volume_mounts=record.volume_mounts,
    )


def census(layout: Layout, init_watch: InitWatch) -> Census:
    """The created sandboxes (no pool sandbox) that are not dead: those whose init
    lives (paused or not) or whose memory is checkpointed, and those ``kept`` with their
    files only (parked, or their init died and their disk is there) — what the runtime's
    ``list`` holds that is not dead, for the worker's reconcile, every tick. One directory
    walk, a stat per sandbox (its record is parsed again only when it changed), one poll of
    the inits' pidfds (``init_watch``, kept by the runtime object) and a stat per dead one."""
    inits: dict[str, tuple[int, int]] = {}
    kept: set[str] = set()
    checkpointed: set[str] = set()
    for sid in layout.sandbox_ids():
        record = layout.read_state_cached(sid)
        if record is None or record.is_warm:
            continue
        if record.parked is not None:
            # Parked with its memory checkpointed (gVisor): paused in full, not kept.
            (checkpointed if record.parked.memory else kept).add(sid)
        else:
            inits[sid] = (record.init_pid, record.init_start)
    alive = init_watch.alive(inits)
    kept |= {s for s in inits.keys() - alive if disks.exists(layout.sandbox_dir(s))}
    return Census(live=frozenset(alive | kept | checkpointed), kept=frozenset(kept))


def volume_users(layout: Layout, cgroups: Cgroups, volume_id: str) -> set[str]:
    """The live (running or paused) sandboxes whose record names the volume."""
    records = map(layout.read_state, layout.sandbox_ids())
    return {
        r.sandbox_id
        for r in records
        if r is not None
        and any(m.volume_id == volume_id for m in r.volume_mounts)
        and status_of(layout, cgroups, r).state is not SandboxState.DEAD
    }
