"""Sandbox writes: every state change goes through a function here.

The pattern for each transition (STYLE.md rule 3): claim it in one short transaction under a
row lock (``select_for_update``), call the runtime with no lock and no transaction held, then
record the outcome in a second short transaction. A process that dies between the two
leaves the row in a transitional state with ``state_changed_at`` set; the lifecycle worker
finishes it (see :func:`sandbox_recover_stale`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from e2bfacade.errors import (
    ApiError,
    BadRequest,
    Conflict,
    NotFound,
    NothingAllocated,
    ServiceUnavailable,
)
from e2bfacade.failpoints import failpoint
from e2bfacade.models import Team
from e2bfacade.runtime.base import (
    CreateRefused,
    ImageNotFound,
    RuntimeConflict,
    RuntimeUnavailable,
    SandboxNotFound,
    SandboxRuntimeError,
    SandboxSpec,
    SandboxState,
)
from e2bfacade.runtime.local import BASE_IMAGE
from e2bfacade.sandbox_runtime import get_runtime
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox, new_sandbox_id
from templates.models import Template

logger = logging.getLogger(__name__)

State = Sandbox.State
LIVE_STATES = [State.RUNNING, State.PAUSING, State.PAUSED, State.RESUMING]
# How long a caller waits for another caller's transition on the same sandbox to finish
# before answering 409 (E2B's connect waits too). Transitions take milliseconds.
TRANSITION_WAIT_SECONDS = 5.0


def not_found(sandbox_id: str) -> NotFound:
    return NotFound(f"Sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")


def runtime_error(exc: Exception) -> ApiError:
    """A runtime failure as an API error with a message a human can act on."""
    if isinstance(exc, RuntimeUnavailable):
        # Permanent for this host: tell the SDK not to retry.
        return ServiceUnavailable(exc.message, headers={"Should-Retry": "false"})
    if isinstance(exc, RuntimeConflict):
        return Conflict(exc.message)
    if isinstance(exc, CreateRefused):
        return ServiceUnavailable(f"the sandbox runtime refused: {exc.message}")
    return ServiceUnavailable(f"sandbox runtime error: {exc}")


@dataclass(frozen=True)
class CreateRequest:
    """A validated create body (see serializers.NewSandboxSerializer)."""

    template_ref: str
    timeout: int
    auto_pause: bool = False
    auto_resume: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)


def check_timeout(timeout: int) -> None:
    maximum = settings.SANDBOX_MAX_TIMEOUT_SECONDS
    if timeout > maximum:
        raise BadRequest(f"timeout {timeout}s exceeds the maximum of {maximum}s")


# ------------------------------------------------------------------------------- create
def sandbox_reserve(
    *, team: Team, request: CreateRequest, sandbox_id: str | None = None
) -> Sandbox:
    """Insert the sandbox row in state ``creating``: the intent is durable before anything
    is allocated. Deterministic refusals (unknown template, timeout too long) are raised
    here, before any row exists. Joins the caller's transaction if there is one."""
    check_timeout(request.timeout)
    # Resolve and lock in one query (the candidates — at most the team's alias and a public
    # one — in pk order, so concurrent creates lock them alike). The lock holds until our
    # sandbox row is committed: template_delete takes it too, so it either sees this
    # sandbox or runs before we resolve.
    template = (
        Template.objects.select_for_update().order_by("pk").resolve(team.pk, request.template_ref)
    )
    if template is None:
        raise NotFound(f"template '{request.template_ref}' not found")
    now = timezone.now()
    return Sandbox.objects.create(
        sandbox_id=sandbox_id or new_sandbox_id(),
        team=team,
        template=template,
        alias=template.alias or "",
        state=State.CREATING,
        state_changed_at=now,
        started_at=now,
        end_at=now + timedelta(seconds=request.timeout),
        cpu_count=template.cpu_count,
        memory_mb=template.memory_mb,
        disk_size_mb=template.disk_size_mb,
        envd_version=template.envd_version,
        metadata=request.metadata,
        env_vars=request.env_vars,
        on_timeout=Sandbox.OnTimeout.PAUSE if request.auto_pause else Sandbox.OnTimeout.KILL,
        auto_resume=request.auto_resume,
    )


def sandbox_start(*, sandbox: Sandbox) -> Sandbox:
    """Drive a ``creating`` sandbox to ``running``. Safe to call again for the same row
    (the runtime adopts an id that already runs), so a crashed create can be re-driven.

    Raises :class:`ServiceUnavailable` when the runtime refused; the row is then deleted,
    since the refusal proves nothing was allocated.
    """
    template = sandbox.template
    runtime = get_runtime()
    try:
        if template.image_id == BASE_IMAGE:
            runtime.ensure_base_image()
        runtime.create(
            SandboxSpec(
                sandbox_id=sandbox.sandbox_id,
                image_id=template.image_id,
                cpu_count=sandbox.cpu_count,
                memory_mb=sandbox.memory_mb,
                pids_max=template.pids_max,
            )
        )
    except (CreateRefused, ImageNotFound, RuntimeUnavailable) as exc:
        # The runtime rolled back whatever it made: nothing is allocated, so the row goes
        # too and an idempotency key used for this request is released.
        Sandbox.objects.filter(pk=sandbox.pk, state=State.CREATING).delete()
        if isinstance(exc, ImageNotFound):
            message = f"template '{template}' has no runtime image on this host: {exc.message}"
            raise NothingAllocated(message, headers={"Should-Retry": "false"}) from exc
        error = runtime_error(exc)
        raise NothingAllocated(error.message, headers=error.headers) from exc
    except SandboxRuntimeError as exc:
        # Anything else may have got part of the way: keep the row in "creating" so a keyed
        # retry re-drives the same id (the runtime adopts it) and, unkeyed, the worker's
        # stale-transition sweep removes whatever was made.
        raise runtime_error(exc) from exc
    failpoint("after_runtime_create")
    now = timezone.now()
    with transaction.atomic():
        row = Sandbox.objects.select_for_update().get(pk=sandbox.pk)
        if row.state == State.CREATING:
            # The clock starts when the sandbox does: endAt = start + timeout.
            timeout = row.end_at - row.started_at
            row.state = State.RUNNING
            row.state_changed_at = now
            row.started_at = now
            row.end_at = now + timeout
            row.save(update_fields=["state", "state_changed_at", "started_at", "end_at"])
            return row
    if row.state in (State.KILLING, State.KILLED):
        # Killed while it was being created: make sure nothing runs.
        runtime.kill(row.sandbox_id)
        raise not_found(row.sandbox_id)
    return row  # another driver of the same id finished first


def sandbox_create(*, team: Team, request: CreateRequest, sandbox_id: str | None = None) -> Sandbox:
    """Create the sandbox ``sandbox_id`` (a new id when None), or adopt it if a previous
    attempt got any part of the way: safe to re-drive with the same id after a crash."""
    sandbox = None
    if sandbox_id is not None:
        sandbox = (
            Sandbox.objects.select_related("template").filter(pk=sandbox_id, team=team).first()
        )
    if sandbox is None:
        with transaction.atomic():
            sandbox = sandbox_reserve(team=team, request=request, sandbox_id=sandbox_id)
    if sandbox.state == State.CREATING:
        return sandbox_start(sandbox=sandbox)
    return sandbox


# ------------------------------------------------------------------------------ lookups
def sandbox_get(*, team: Team, sandbox_id: str) -> Sandbox:
    sandbox = (
        Sandbox.objects.of_team(team.pk)
        .live()
        .select_related("template")
        .filter(pk=sandbox_id)
        .first()
    )
    if sandbox is None:
        raise not_found(sandbox_id)
    return sandbox


# ---------------------------------------------------------------------- transition core
def _claim(
    *,
    team: Team,
    sandbox_id: str,
    allowed: dict[str, str],
    conflict: dict[str, str] | None = None,
    wait: bool = True,
) -> tuple[Sandbox, str]:
    """Lock the sandbox and move it from one of ``allowed``'s keys to the mapped state.

    Returns the row (before the change) and its previous state. States in ``conflict``
    answer 409 with the mapped message; other live transitional states are waited out for
    up to :data:`TRANSITION_WAIT_SECONDS`, then 409.
    """
    deadline = time.monotonic() + (TRANSITION_WAIT_SECONDS if wait else 0)
    while True:
        now = timezone.now()
        with transaction.atomic():
            # The row lock serialises transitions of one sandbox across every worker and
            # replica; it is held only for this check-and-set, never across a runtime call.
            row = (
                Sandbox.objects.select_for_update()
                .of_team(team.pk)
                .filter(pk=sandbox_id)
                .exclude(state__in=[State.KILLED, State.CREATING])
                .first()
            )
            if row is None:
                raise not_found(sandbox_id)
            previous = row.state
            if previous == State.KILLING:
                raise Conflict(f"sandbox {sandbox_id} is being killed")
            if previous in allowed:
                row.state = allowed[previous]
                row.state_changed_at = now
                row.save(update_fields=["state", "state_changed_at"])
                return row, previous
            if conflict and previous in conflict:
                raise Conflict(conflict[previous])
        if time.monotonic() >= deadline:
            raise Conflict(f"sandbox {sandbox_id} is {previous}; try again shortly")
        time.sleep(0.02)


def _finish(sandbox: Sandbox, from_state: str, to_state: str, **fields: object) -> Sandbox:
    """Record a transition's outcome, fenced on the transitional state we claimed."""
    now = timezone.now()
    updated = Sandbox.objects.filter(pk=sandbox.pk, state=from_state).update(
        state=to_state, state_changed_at=now, **fields
    )
    sandbox.refresh_from_db()
    if not updated:
        logger.warning("sandbox %s left %s before we finished", sandbox.pk, from_state)
    return sandbox


def _runtime_call(
    sandbox: Sandbox, claimed: str, rollback_to: str, fn: object, *args: object
) -> None:
    """Run a runtime operation for a claimed transition; on failure restore the previous
    state (the runtime's operations are all-or-nothing) and raise an API error."""
    try:
        fn(*args)  # type: ignore[operator]
    except SandboxNotFound as exc:
        # It died under us: record that and answer as E2B does for a missing sandbox.
        _finish(sandbox, claimed, State.KILLED, killed_at=timezone.now())
        raise not_found(sandbox.sandbox_id) from exc
    except (SandboxRuntimeError, OSError) as exc:
        _finish(sandbox, claimed, rollback_to)
        raise runtime_error(exc) from exc


# --------------------------------------------------------------------------- lifecycle
def sandbox_pause(*, team: Team, sandbox_id: str) -> Sandbox:
    """running -> paused. A second pause answers 409 (the SDK reads it as "already paused")."""
    sandbox, _ = _claim(
        team=team,
        sandbox_id=sandbox_id,
        allowed={State.RUNNING: State.PAUSING},
        conflict={
            State.PAUSED: f"sandbox {sandbox_id} is already paused",
            State.PAUSING: f"sandbox {sandbox_id} is already being paused",
        },
    )
    _runtime_call(sandbox, State.PAUSING, State.RUNNING, get_runtime().pause, sandbox_id)
    return _finish(sandbox, State.PAUSING, State.PAUSED)


def _resume(sandbox: Sandbox, timeout: int) -> Sandbox:
    _runtime_call(sandbox, State.RESUMING, State.PAUSED, get_runtime().resume, sandbox.sandbox_id)
    return _finish(
        sandbox, State.RESUMING, State.RUNNING, end_at=timezone.now() + timedelta(seconds=timeout)
    )


def sandbox_resume(*, team: Team, sandbox_id: str, timeout: int) -> Sandbox:
    """Legacy resume: paused -> running (201); already running -> 409."""
    check_timeout(timeout)
    sandbox, _ = _claim(
        team=team,
        sandbox_id=sandbox_id,
        allowed={State.PAUSED: State.RESUMING},
        conflict={
            State.RUNNING: f"sandbox {sandbox_id} is already running",
            State.RESUMING: f"sandbox {sandbox_id} is already being resumed",
        },
    )
    return _resume(sandbox, timeout)


def sandbox_connect(*, team: Team, sandbox_id: str, timeout: int) -> tuple[Sandbox, bool]:
    """Running: extend the end time only (``max(endAt, now + timeout)``), 200. Paused:
    resume, 201. Returns the sandbox and whether it was resumed."""
    check_timeout(timeout)
    sandbox, previous = _claim(
        team=team,
        sandbox_id=sandbox_id,
        # running -> running is a no-op claim that still takes the row lock.
        allowed={State.RUNNING: State.RUNNING, State.PAUSED: State.RESUMING},
    )
    if previous == State.RUNNING:
        new_end = timezone.now() + timedelta(seconds=timeout)
        Sandbox.objects.filter(pk=sandbox.pk, end_at__lt=new_end).update(end_at=new_end)
        sandbox.refresh_from_db()
        return sandbox, False
    return _resume(sandbox, timeout), True


def sandbox_set_timeout(*, team: Team, sandbox_id: str, timeout: int) -> None:
    """``endAt = now + timeout`` for a running sandbox (it may shorten); 404 otherwise."""
    check_timeout(timeout)
    updated = (
        Sandbox.objects.of_team(team.pk)
        .filter(pk=sandbox_id, state=State.RUNNING)
        .update(end_at=timezone.now() + timedelta(seconds=timeout))
    )
    if not updated:
        raise not_found(sandbox_id)


def sandbox_refresh(*, team: Team, sandbox_id: str, duration: int) -> None:
    """Extend-only keep-alive: ``endAt = max(endAt, now + duration)``."""
    check_timeout(duration)
    qs = Sandbox.objects.of_team(team.pk).filter(pk=sandbox_id, state=State.RUNNING)
    new_end = timezone.now() + timedelta(seconds=duration)
    if not qs.filter(end_at__lt=new_end).update(end_at=new_end) and not qs.exists():
        raise not_found(sandbox_id)


def sandbox_kill(*, team: Team, sandbox_id: str) -> None:
    """Kill and delete. Exactly one caller answers 204 — the one whose kill recorded the
    sandbox as killed — and the others 404. The runtime's kill is idempotent, so a retry
    after a failed kill (503) re-drives it and is the one that gets 204."""
    now = timezone.now()
    with transaction.atomic():
        row = (
            Sandbox.objects.select_for_update()
            .of_team(team.pk)
            .filter(pk=sandbox_id)
            .exclude(state=State.KILLED)
            .first()
        )
        if row is None:
            raise not_found(sandbox_id)
        row.state = State.KILLING
        row.state_changed_at = now
        row.save(update_fields=["state", "state_changed_at"])
    if not _kill_runtime(row):
        raise not_found(sandbox_id)  # a concurrent caller's kill recorded it first


def _kill_runtime(sandbox: Sandbox) -> bool:
    """Kill in the runtime, then record ``killed`` fenced on ``killing``. Returns whether
    this call's record landed (False: another caller's kill recorded it first)."""
    try:
        get_runtime().kill(sandbox.sandbox_id)
    except (SandboxRuntimeError, OSError) as exc:
        # Stay in "killing": the worker re-drives it. The caller learns it did not finish.
        raise runtime_error(exc) from exc
    now = timezone.now()
    recorded = Sandbox.objects.filter(pk=sandbox.pk, state=State.KILLING).update(
        state=State.KILLED, state_changed_at=now, killed_at=now
    )
    return bool(recorded)


def sandbox_metrics(*, team: Team, sandbox_id: str) -> dict[str, object]:
    sandbox = sandbox_get(team=team, sandbox_id=sandbox_id)
    try:
        m = get_runtime().metrics(sandbox.sandbox_id)
    except SandboxNotFound as exc:
        raise not_found(sandbox_id) from exc
    except SandboxRuntimeError as exc:
        raise runtime_error(exc) from exc
    now = timezone.now()
    return {
        "timestamp": now,
        "timestampUnix": int(now.timestamp()),
        "cpuCount": m.cpu_count,
        "cpuUsedPct": m.cpu_used_pct,
        "memUsed": m.mem_used,
        "memTotal": m.mem_total,
        "memCache": m.mem_cache,
        "diskUsed": m.disk_used,
        "diskTotal": sandbox.disk_size_mb * 1024 * 1024,
    }


# ------------------------------------------------------------------------------ worker
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
            _finish(row, State.PAUSING, State.KILLED, killed_at=timezone.now())
            return "gone"
        except RuntimeConflict:
            pass  # already frozen: the outcome we wanted
        _finish(row, State.PAUSING, State.PAUSED)
        return "paused"
    _kill_runtime(row)
    return "killed"


def sandbox_recover_stale(*, older_than: datetime) -> list[str]:
    """Finish transitions abandoned by a dead process (state unchanged since
    ``older_than``): creating is re-driven or dropped, pausing/resuming are settled from
    what the runtime reports, killing is re-driven."""
    recovered = []
    runtime = get_runtime()
    stale = Sandbox.objects.filter(
        state__in=[State.CREATING, State.PAUSING, State.RESUMING, State.KILLING],
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
            _kill_runtime(row)
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
                _finish(row, claimed, State.KILLED, killed_at=timezone.now())
            else:
                target = State.PAUSED if actual is SandboxState.PAUSED else State.RUNNING
                _finish(row, claimed, target)
        recovered.append(sandbox_id)
    return recovered


def sandbox_reconcile() -> dict[str, list[str]]:
    """Make the database and the runtime agree: a sandbox the database thinks is live but
    the runtime lost is marked killed; a runtime sandbox the database does not know (or
    knows as killed) is killed."""
    runtime = get_runtime()
    # Database first, runtime second: a sandbox the database saw live existed in the runtime
    # before we listed it, so missing from the list means it really died.
    known = dict(Sandbox.objects.exclude(state=State.KILLED).values_list("sandbox_id", "state"))
    actual = {info.sandbox_id: info for info in runtime.list()}
    gone, orphans = [], []
    for sandbox_id, state in known.items():
        if state in (State.CREATING, State.KILLING):
            continue  # in flight: sandbox_recover_stale owns these
        info = actual.get(sandbox_id)
        if info is None or info.state is SandboxState.DEAD:
            updated = Sandbox.objects.filter(pk=sandbox_id, state=state).update(
                state=State.KILLED, state_changed_at=timezone.now(), killed_at=timezone.now()
            )
            if updated:
                runtime.kill(sandbox_id)
                gone.append(sandbox_id)
    for sandbox_id in actual.keys() - known.keys():
        # Re-check under the runtime's view: a create may have reserved it since we read.
        if not Sandbox.objects.filter(pk=sandbox_id).exclude(state=State.KILLED).exists():
            runtime.kill(sandbox_id)
            orphans.append(sandbox_id)
    reaped = runtime.reap_orphans()
    return {"gone": gone, "orphans": orphans, "reaped": reaped}
