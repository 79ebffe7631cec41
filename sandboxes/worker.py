"""What the lifecycle worker does to sandboxes (``manage.py run_worker``): apply timeouts,
finish transitions a dead process abandoned, make the database and the runtime agree, and
keep the runtime's warm pool.

Several workers may run at once: rows are claimed with ``SKIP LOCKED``. Each acts only on
the rows of its own host (``Sandbox.host``, the node :func:`nodes.selectors.local_node`
names): several hosts may share one database, and none ever touches another's sandboxes.
"""

from __future__ import annotations

import logging
import resource
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from e2bfacade import observability
from e2bfacade.runtime.base import (
    PauseMode,
    RuntimeConflict,
    SandboxNotFound,
    SandboxRuntimeError,
    SandboxSpec,
    SandboxState,
)
from idempotency.models import IdempotencyRecord
from nodes.selectors import local_node, runtime_for
from sandboxes.logs import Level, sandbox_log_event
from sandboxes.models import Sandbox, SandboxLogEntry
from sandboxes.services import KEPT, sandbox_finish_kill
from sandboxes.transitions import (
    TIMEOUT_KILL,
    TIMEOUT_PAUSE,
    TRANSITIONAL_STATES,
    paused_fields,
    transition_claim_locked,
    transition_finish,
)
from templates.builds.worker import build_sandbox_ids
from templates.models import Template

State = Sandbox.State
logger = logging.getLogger(__name__)
# Why a sandbox the database held was recorded killed by the reconcile: nothing of it was
# left on its host (its directory and disk gone: a wiped root, a lost disk).
LOST_REASON = "lost: its host no longer has it (its files are gone)"


def sandbox_adopt_hostless() -> int:
    """Give the rows made before sandboxes recorded their host to this host (they can only
    be its: one host was all a database could have then). Returns how many."""
    return (
        Sandbox.objects.filter(host="")
        .exclude(state=State.KILLED)
        .update(host=local_node().host_id)
    )


def sandbox_expire(*, sandbox_id: str) -> str | None:
    """Apply the timeout action of one sandbox whose ``endAt`` has passed. Returns the
    action taken, or None when someone else got there first (SKIP LOCKED)."""
    now = timezone.now()
    node = local_node()  # built, if need be, outside the transaction
    runtime = runtime_for(node)
    with transaction.atomic():
        row = (
            Sandbox.objects.select_for_update(skip_locked=True)
            .expired(now)
            .on_host(node.host_id)
            .filter(pk=sandbox_id)
            .first()
        )
        if row is None:
            return None
        pause = row.on_timeout == Sandbox.OnTimeout.PAUSE
        transition_claim_locked(row, TIMEOUT_PAUSE if pause else TIMEOUT_KILL, now)
    if pause:
        mode = PauseMode.FULL if row.auto_pause_memory else PauseMode.FILESYSTEM
        try:
            runtime.pause(row.sandbox_id, memory=row.auto_pause_memory)
        except SandboxNotFound:
            transition_finish(row, State.PAUSING, State.KILLED, killed_at=timezone.now())
            sandbox_log_event(
                sandbox_id,
                "its timeout was reached, and nothing of it was left to pause",
                level=Level.ERROR,
                event="killed",
            )
            return "gone"
        except RuntimeConflict:
            # Already paused (frozen, or its processes ended under it): what it kept is
            # what the runtime says.
            info = runtime.status(row.sandbox_id)
            mode = info.pause_mode or mode
        transition_finish(row, State.PAUSING, State.PAUSED, **paused_fields(mode))
        sandbox_log_event(
            sandbox_id, f"paused: its timeout was reached, {KEPT[mode]}", event="paused"
        )
        return "paused"
    sandbox_finish_kill(sandbox=row, reason="as its timeout was reached")
    return "killed"


def sandbox_recover_stale(*, older_than: datetime) -> list[str]:
    """Finish transitions abandoned by a dead process (state unchanged since
    ``older_than``): creating is re-driven or dropped, pausing/resuming are settled from
    what the runtime reports, killing is re-driven."""
    recovered = []
    node = local_node()
    runtime = runtime_for(node)
    stale = (
        Sandbox.objects.on_host(node.host_id)
        .filter(state__in=TRANSITIONAL_STATES, state_changed_at__lt=older_than)
        .values_list("pk", flat=True)
    )
    for sandbox_id in list(stale[:500]):
        with transaction.atomic():
            row = (
                Sandbox.objects.select_for_update(skip_locked=True)
                .filter(pk=sandbox_id, state_changed_at__lt=older_than)
                .select_related("template")
                .first()
            )
            if row is None or row.state in (State.RUNNING, State.PAUSED, State.KILLED):
                continue
            claimed = row.state
            # Touch it so a concurrent worker does not pick it up while we act.
            row.state_changed_at = timezone.now()
            row.save(update_fields=["state_changed_at"])
        if claimed == State.KILLING:
            sandbox_finish_kill(sandbox=row, reason="(a kill its caller left unfinished)")
        elif claimed == State.CREATING:
            if IdempotencyRecord.objects.filter(
                resource_id=row.sandbox_id, state=IdempotencyRecord.State.IN_PROGRESS
            ).exists():
                continue  # a keyed create: idempotency's drive_abandoned re-drives it
            # Its creator died before answering, so nobody was handed this sandbox: make
            # sure none runs and drop the row.
            runtime.kill(row.sandbox_id)
            Sandbox.objects.filter(pk=row.pk, state=State.CREATING).delete()
        else:
            try:
                info = runtime.status(row.sandbox_id)
            except SandboxNotFound:
                info = None
            if info is None or info.state is SandboxState.DEAD:
                runtime.kill(row.sandbox_id)
                _record_lost(row.sandbox_id, claimed)
            elif info.state is SandboxState.PAUSED:
                fields = paused_fields(info.pause_mode, info.pause_reason)
                transition_finish(row, claimed, State.PAUSED, **fields)
                _log_recovered(row.sandbox_id, claimed, "paused")
            else:
                transition_finish(row, claimed, State.RUNNING)
                _log_recovered(row.sandbox_id, claimed, "running")
        recovered.append(sandbox_id)
    return recovered


def _log_recovered(sandbox_id: str, claimed: str, state: str) -> None:
    sandbox_log_event(
        sandbox_id,
        f"{state}: the process that was {claimed} it died; the runtime says it is {state}",
        level=Level.WARN,
        event=state,
    )


def raise_open_files_limit() -> None:
    """Raise this process's open-files limit (to its hard limit, at most 65 536): the
    reconcile's census keeps a pidfd per live sandbox (the local runtime's InitWatch), and
    the soft limit (often 1 024) would leave it checking the rest one by one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _record_lost(sandbox_id: str, state: str) -> bool:
    """Record a sandbox whose host no longer has anything of it as killed, with why, and say
    so loudly: its files are lost. Fenced on ``state``."""
    now = timezone.now()
    updated = Sandbox.objects.filter(pk=sandbox_id, state=state).update(
        state=State.KILLED, state_changed_at=now, killed_at=now, state_reason=LOST_REASON
    )
    if updated:
        logger.error("sandbox %s is lost: %s", sandbox_id, LOST_REASON)
        observability.sandbox_lost()
        sandbox_log_event(sandbox_id, f"killed: {LOST_REASON}", level=Level.ERROR, event="lost")
    return bool(updated)


def sandbox_reconcile() -> dict[str, list[str]]:
    """Make the database and this host's runtime agree, on this host's rows only:

    - a sandbox the database holds running whose processes ended under it (a crash, a
      reboot) is kept paused with its files, and the reason is recorded; one held paused
      with its memory that lost it is recorded as paused with its files only;
    - a sandbox the database holds live but of which the runtime has nothing left is
      recorded killed, as lost (logged as an error, counted in /metrics);
    - a runtime sandbox the database does not know (or knows as killed) is killed.
    """
    node = local_node()
    runtime = runtime_for(node)
    # Database first, runtime second: a sandbox the database saw live existed in the runtime
    # before we listed it, so missing from the list means it really died.
    rows = Sandbox.objects.on_host(node.host_id).exclude(state=State.KILLED)
    known = {
        sid: (state, mode)
        for sid, state, mode in rows.values_list("sandbox_id", "state", "pause_mode")
    }
    census = runtime.census()
    gone, orphans, kept = [], [], []
    for sandbox_id, (state, mode) in known.items():
        if state not in (State.RUNNING, State.PAUSED):
            continue  # in flight: sandbox_recover_stale owns these
        if sandbox_id not in census.live:
            if _record_lost(sandbox_id, state):
                runtime.kill(sandbox_id)
                gone.append(sandbox_id)
        elif sandbox_id in census.kept and mode != PauseMode.FILESYSTEM:
            if _record_kept(sandbox_id, state):
                kept.append(sandbox_id)
    # Template builds run in sandboxes of their own, which no row names.
    building = build_sandbox_ids()
    for sandbox_id in census.live - known.keys() - building:
        # Re-check under the runtime's view: a create may have reserved it since we read.
        if not Sandbox.objects.filter(pk=sandbox_id).exclude(state=State.KILLED).exists():
            runtime.kill(sandbox_id)
            orphans.append(sandbox_id)
    # What died without a pause is tidied by the sweep (its groups and rules released, its
    # files kept), so it is looked at again; what runs, or was paused, need not be.
    reaped = runtime.sweep(seen_live=census.live - census.kept)
    return {"gone": gone, "orphans": orphans, "reaped": reaped, "kept": kept}


LIMIT_EVENTS = (
    (
        "oom",
        "oom_kills",
        Level.ERROR,
        "out of memory: the kernel killed {n} process(es) of the "
        "sandbox at its memory limit ({total} since it started)",
    ),
    (
        "pid_limit",
        "pid_limit_hits",
        Level.WARN,
        "pid limit reached: {n} fork(s) refused at the "
        "sandbox's process limit ({total} since it started)",
    ),
)


def sandbox_log_limits() -> list[str]:
    """Log the limits this host's running sandboxes met since the last look: processes the
    kernel killed at the memory limit (OOM) and forks refused at the pids limit, read from
    the runtime's counters. The count a log entry last reported is the baseline (the event's
    newest entry, only for a sandbox whose counter is not zero); counters start afresh with
    a sandbox's processes, so a count below it is a new start. Returns the ids logged."""
    node = local_node()
    runtime = runtime_for(node)
    logged = []
    running = Sandbox.objects.on_host(node.host_id).filter(state=State.RUNNING)
    for sandbox_id in running.values_list("sandbox_id", flat=True):
        try:
            counters = runtime.limit_events(sandbox_id)
        except SandboxRuntimeError:
            continue  # ended since the list was read
        for event, attr, level, text in LIMIT_EVENTS:
            total = int(getattr(counters, attr))
            if not total:
                continue
            last = (
                SandboxLogEntry.objects.filter(sandbox_id=sandbox_id, fields__event=event)
                .order_by("-timestamp", "-id")
                .values_list("fields", flat=True)
                .first()
            )
            seen = int((last or {}).get("count", 0))
            if total == seen:
                continue
            n = total - seen if total > seen else total
            message = text.format(n=n, total=total)
            sandbox_log_event(sandbox_id, message, level=level, event=event, count=str(total))
            logged.append(sandbox_id)
    return logged


def _record_kept(sandbox_id: str, state: str) -> bool:
    """Record a sandbox whose processes ended under it as paused with its files (why, from
    the runtime), fenced on ``state``."""
    info = runtime_for(local_node()).status(sandbox_id)
    if info.pause_mode is not PauseMode.FILESYSTEM:
        return False
    fields = paused_fields(PauseMode.FILESYSTEM, info.pause_reason)
    updated = Sandbox.objects.filter(pk=sandbox_id, state=state).update(
        state=State.PAUSED, state_changed_at=timezone.now(), **fields
    )
    if updated and info.pause_reason:
        logger.warning(
            "sandbox %s is kept paused with its files: %s", sandbox_id, info.pause_reason
        )
    if updated:
        sandbox_log_event(
            sandbox_id,
            f"paused: {info.pause_reason or 'its processes ended'}",
            level=Level.ERROR,
            event="crashed",
        )
    return bool(updated)


def sandbox_keep_warm() -> list[str]:
    """Tell the runtime which warm pools to keep: one per template whose pool is not
    empty (by default, each public template with a start command, code-interpreter-v1
    among them; ``Template.warm_pool`` sets any template's). The runtime ends the idle pool
    sandboxes of every other shape. Returns the templates whose image this host has."""
    runtime = runtime_for(local_node())
    asked, specs = [], []
    for template in Template.objects.filter(kind=Template.Kind.TEMPLATE).order_by("pk"):
        if template.warm_pool == 0:
            continue
        try:
            start = runtime.image_info(template.image_id).start
        except SandboxRuntimeError:
            continue  # its image is not built on this host
        # By default only the public templates with a start command (code-interpreter-v1)
        # get a pool: a team may build any number of templates, and each pool sandbox
        # holds its memory and runs its start command until it is claimed.
        if template.warm_pool is None and (start is None or template.team_id is not None):
            continue
        specs.append(
            SandboxSpec(
                sandbox_id=f"shape-{template.template_id}",
                image_id=template.image_id,
                cpu_count=template.cpu_count,
                memory_mb=template.memory_mb,
                pids_max=template.pids_max,
                disk_mb=template.disk_size_mb,
                warm_pool=template.warm_pool,
            )
        )
        asked.append(template.template_id)
    runtime.warm_pools(specs)
    return asked
