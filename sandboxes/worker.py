"""What the lifecycle worker does to sandboxes (``manage.py run_worker``): apply timeouts,
finish transitions a dead process abandoned, make the database and the runtime agree, and
keep the runtime's warm pool.
Several workers may run at once: rows are claimed with ``SKIP LOCKED``.
"""

from __future__ import annotations

import resource
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from e2bfacade.runtime.base import (
    RuntimeConflict,
    SandboxNotFound,
    SandboxRuntimeError,
    SandboxSpec,
    SandboxState,
)
from e2bfacade.sandbox_runtime import get_runtime
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox
from sandboxes.services import sandbox_finish_kill
from sandboxes.transitions import TRANSITIONAL_STATES, transition_finish
from templates.models import Template

State = Sandbox.State


def sandbox_expire(*, sandbox_id: str) -> str | None:
    """Apply the timeout action of one sandbox whose ``endAt`` has passed. Returns the
    action taken, or None when someone else got there first (SKIP LOCKED)."""
    now = timezone.now()
    with transaction.atomic():
        row = (
            Sandbox.objects.select_for_update(skip_locked=True)
            .expired(now)
            .filter(pk=sandbox_id)
            .first()
        )
        if row is None:
            return None
        pause = row.on_timeout == Sandbox.OnTimeout.PAUSE
        row.state = State.PAUSING if pause else State.KILLING
        row.state_changed_at = now
        row.save(update_fields=["state", "state_changed_at"])
    if pause:
        try:
            get_runtime().pause(row.sandbox_id)
        except SandboxNotFound:
            transition_finish(row, State.PAUSING, State.KILLED, killed_at=timezone.now())
            return "gone"
        except RuntimeConflict:
            pass  # already frozen: the outcome we wanted
        transition_finish(row, State.PAUSING, State.PAUSED)
        return "paused"
    sandbox_finish_kill(sandbox=row)
    return "killed"


def sandbox_recover_stale(*, older_than: datetime) -> list[str]:
    """Finish transitions abandoned by a dead process (state unchanged since
    ``older_than``): creating is re-driven or dropped, pausing/resuming are settled from
    what the runtime reports, killing is re-driven."""
    recovered = []
    runtime = get_runtime()
    stale = Sandbox.objects.filter(
        state__in=TRANSITIONAL_STATES,
        state_changed_at__lt=older_than,
    ).values_list("pk", flat=True)
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
            sandbox_finish_kill(sandbox=row)
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
                actual = runtime.status(row.sandbox_id).state
            except SandboxNotFound:
                actual = SandboxState.DEAD
            if actual is SandboxState.DEAD:
                runtime.kill(row.sandbox_id)
                transition_finish(row, claimed, State.KILLED, killed_at=timezone.now())
            else:
                target = State.PAUSED if actual is SandboxState.PAUSED else State.RUNNING
                transition_finish(row, claimed, target)
        recovered.append(sandbox_id)
    return recovered


def make_room_for_the_census() -> None:
    """Raise this process's open-files limit (to its hard limit, at most 65 536): the
    reconcile's census keeps a pidfd per live sandbox (the local runtime's InitWatch), and
    the soft limit (often 1 024) would leave it checking the rest one by one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def sandbox_reconcile() -> dict[str, list[str]]:
    """Make the database and the runtime agree: a sandbox the database thinks is live but
    the runtime lost is marked killed; a runtime sandbox the database does not know (or
    knows as killed) is killed."""
    runtime = get_runtime()
    # Database first, runtime second: a sandbox the database saw live existed in the runtime
    # before we listed it, so missing from the list means it really died.
    known = dict(Sandbox.objects.exclude(state=State.KILLED).values_list("sandbox_id", "state"))
    actual = runtime.live_ids()
    gone, orphans = [], []
    for sandbox_id, state in known.items():
        if state in (State.CREATING, State.KILLING):
            continue  # in flight: sandbox_recover_stale owns these
        if sandbox_id not in actual:
            updated = Sandbox.objects.filter(pk=sandbox_id, state=state).update(
                state=State.KILLED, state_changed_at=timezone.now(), killed_at=timezone.now()
            )
            if updated:
                runtime.kill(sandbox_id)
                gone.append(sandbox_id)
    for sandbox_id in actual - known.keys():
        # Re-check under the runtime's view: a create may have reserved it since we read.
        if not Sandbox.objects.filter(pk=sandbox_id).exclude(state=State.KILLED).exists():
            runtime.kill(sandbox_id)
            orphans.append(sandbox_id)
    reaped = runtime.sweep(seen_live=actual)
    return {"gone": gone, "orphans": orphans, "reaped": reaped}


def sandbox_keep_warm() -> list[str]:
    """Tell the runtime which warm pools to keep: one per template whose pool is not
    empty (by default, each template with a start command, code-interpreter-v1 among them;
    ``Template.warm_pool`` sets any template's). The runtime ends the idle pool sandboxes of
    every other shape. Returns the templates whose image this host has."""
    runtime = get_runtime()
    asked, specs = [], []
    for template in Template.objects.filter(kind=Template.Kind.TEMPLATE).order_by("pk"):
        if template.warm_pool == 0:
            continue
        try:
            start = runtime.image_info(template.image_id).start
        except SandboxRuntimeError:
            continue  # its image is not built on this host
        if template.warm_pool is None and start is None:
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
