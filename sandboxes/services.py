"""Sandbox writes the API makes: create, pause, resume, connect, timeouts, kill, metrics.

Every state change is a claim / act / finish through :mod:`sandboxes.transitions`, where
the state machine is declared; what the lifecycle worker does is in :mod:`sandboxes.worker`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from e2bfacade import crypto
from e2bfacade.errors import ApiError, BadRequest, Conflict, NotFound, NothingAllocated
from e2bfacade.failpoints import failpoint
from e2bfacade.models import Team
from e2bfacade.runtime.base import (
    CreateRefused,
    ImageNotFound,
    Metrics,
    NetworkPolicy,
    PauseMode,
    RuntimeUnavailable,
    SandboxNotFound,
    SandboxRuntimeError,
    SandboxSpec,
    UpstreamProxy,
)
from e2bfacade.runtime.volumes import VolumeMount, VolumeNotFound
from nodes.selectors import local_node, node_for_sandbox, runtime_for, sandbox_runtime
from sandboxes.admission import placement, sandbox_admit
from sandboxes.logs import Level, sandbox_log_boot, sandbox_log_event
from sandboxes.models import Sandbox, SandboxVolumeMount, new_access_token, new_sandbox_id
from sandboxes.secrets.selectors import check_rule_placeholders
from sandboxes.transitions import (
    CONNECT,
    KILL,
    PAUSE,
    RESUME,
    not_found,
    paused_fields,
    runtime_error,
    transition_act,
    transition_claim,
    transition_finish,
)
from sandboxes.usage import team_metrics_started
from sandboxes.volumes.services import volume_mounts_resolve
from templates.builds import tags

logger = logging.getLogger(__name__)

State = Sandbox.State


@dataclass(frozen=True)
class CreateRequest:
    """A validated create body (see serializers.NewSandboxSerializer)."""

    template_ref: str
    timeout: int
    auto_pause: bool = False
    auto_pause_memory: bool = True
    auto_resume: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    allow_internet: bool = False
    network: dict[str, Any] = field(default_factory=dict)  # create's ``network``, validated
    # create's ``volumeMounts`` as (volume name, guest path), in the order given
    volume_mounts: tuple[tuple[str, str], ...] = ()
    # create's ``iam``: {"tokens": {...}, "issuer": the URL tokens name as ``iss``}
    iam: dict[str, Any] = field(default_factory=dict)


NETWORK_FIELDS = (
    "allowOut",
    "denyOut",
    "dnsServers",
    "rules",
    "egressProxy",
)  # what an update replaces


def network_policy(allow_internet: bool, network: dict[str, Any]) -> NetworkPolicy:
    """The runtime's view of a sandbox's egress (E2B's allowOut / denyOut / dnsServers, and
    its ``rules``: per domain, the headers of its rules' transforms, merged in order)."""
    dns = network.get("dnsServers")
    transforms = []
    for domain, rules in (network.get("rules") or {}).items():
        headers: dict[str, str] = {}
        for rule in rules:
            headers |= (rule.get("transform") or {}).get("headers") or {}
        if headers:
            transforms.append((domain, tuple(headers.items())))
    proxy = network.get("egressProxy")
    return NetworkPolicy(
        upstream=None if not proxy else UpstreamProxy(proxy["address"], proxy.get("username")),
        allow_internet=allow_internet,
        allow_out=tuple(network.get("allowOut") or ()),
        deny_out=tuple(network.get("denyOut") or ()),
        dns_servers=None if dns is None else tuple(dns),
        transforms=tuple(transforms),
    )


def egress_proxy_split(network: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """``network`` as a sandbox's row keeps it — its egressProxy without the password —
    and the password, encrypted (empty: none)."""
    proxy = network.get("egressProxy")
    if not proxy:
        return network, b""
    password = proxy.get("password")
    kept = {k: v for k, v in proxy.items() if k != "password"}
    return {**network, "egressProxy": kept}, (
        crypto.encrypt(password.encode()) if password is not None else b""
    )


def check_timeout(timeout: int) -> None:
    maximum = settings.SANDBOX_MAX_TIMEOUT_SECONDS
    if timeout > maximum:
        raise BadRequest(f"timeout {timeout}s exceeds the maximum of {maximum}s")


# ------------------------------------------------------------------------------- create
def sandbox_reserve(
    *, team: Team, request: CreateRequest, sandbox_id: str | None = None
) -> Sandbox:
    """Insert the sandbox row in state ``creating``: the intent is durable before anything
    is allocated. Deterministic refusals (unknown template, timeout too long, a template
    this host cannot hold) and admission's limits (sandboxes.admission) are raised here,
    before any row exists. Joins the caller's transaction if there is one."""
    check_timeout(request.timeout)
    # Resolve and lock in one query (the candidates — at most the team's alias and a public
    # one — in pk order, so concurrent creates lock them alike). The lock holds until our
    # sandbox row is committed: template_delete takes it too, so it either sees this
    # sandbox or runs before we resolve.
    found = tags.resolve(team.pk, request.template_ref, locked=True)
    if found is None:
        raise NotFound(f"template '{request.template_ref}' not found")
    template = found.template
    if not found.image_id:
        raise BadRequest(
            f"template '{request.template_ref}' has no ready build yet",
            headers={"Should-Retry": "false"},
        )
    check_rule_placeholders(
        team_id=team.pk,
        rules=request.network.get("rules"),
        tokens=set((request.iam.get("tokens") or {}).keys()),
    )
    node = sandbox_admit(team=team, template=template)
    # Resolved (and the volumes locked) before the row is written: a refusal writes nothing.
    mounts = volume_mounts_resolve(team=team, mounts=request.volume_mounts, node=node)
    now = timezone.now()
    network, proxy_password = egress_proxy_split(
        {
            k: v
            for k, v in request.network.items()
            if k in (*NETWORK_FIELDS, "maskRequestHost")  # the last: create only
        }
    )
    sandbox = Sandbox.objects.create(
        sandbox_id=sandbox_id or new_sandbox_id(),
        team=team,
        template=template,
        # The image of the build a ``name:tag`` names (empty: the template's own).
        image_id=found.image_id if found.image_id != template.image_id else "",
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
        auto_pause_memory=request.auto_pause_memory,
        auto_resume=request.auto_resume,
        host=node.host_id,
        allow_internet_access=request.allow_internet,
        network=network,
        egress_proxy_password=proxy_password,
        iam=request.iam,
        traffic_access_token=(
            new_access_token() if request.network.get("allowPublicTraffic") is False else ""
        ),
    )
    if mounts:
        SandboxVolumeMount.objects.bulk_create(
            SandboxVolumeMount(sandbox=sandbox, volume=volume, path=path) for volume, path in mounts
        )
    return sandbox


def sandbox_mounts(sandbox: Sandbox) -> tuple[VolumeMount, ...]:
    """The volumes the sandbox's create named, as the runtime mounts them."""
    rows = SandboxVolumeMount.objects.filter(sandbox=sandbox).order_by("pk")
    return tuple(VolumeMount(volume_id=str(m.volume_id), path=m.path) for m in rows)


def sandbox_start(*, sandbox: Sandbox, volume_mounts: tuple[VolumeMount, ...] = ()) -> Sandbox:
    """Drive a ``creating`` sandbox to ``running``, with ``volume_mounts`` (its recorded
    :func:`sandbox_mounts`). Safe to call again for the same row (the runtime adopts an id
    that already runs), so a crashed create can be re-driven.

    Raises :class:`e2bfacade.errors.ServiceUnavailable` when the runtime refused; the row is
    then deleted, since the refusal proves nothing was allocated.
    """
    template = sandbox.template
    runtime = sandbox_runtime(sandbox)
    try:
        runtime.create(
            SandboxSpec(
                sandbox_id=sandbox.sandbox_id,
                image_id=sandbox.image_id or template.image_id,
                cpu_count=sandbox.cpu_count,
                memory_mb=sandbox.memory_mb,
                pids_max=template.pids_max,
                disk_mb=sandbox.disk_size_mb,
                # envd's own variables first, then the create's envVars (which may replace them).
                env_vars={
                    "E2B_SANDBOX": "true",
                    "E2B_SANDBOX_ID": sandbox.sandbox_id,
                    "E2B_TEMPLATE_ID": template.template_id,
                    **sandbox.env_vars,
                },
                envd_access_token=sandbox.envd_access_token,
                network=network_policy(sandbox.allow_internet_access, sandbox.network),
                traffic_access_token=sandbox.traffic_access_token or None,
                mask_request_host=(sandbox.network or {}).get("maskRequestHost") or None,
                warm_pool=template.warm_pool,
                volume_mounts=volume_mounts,
            )
        )
    except (CreateRefused, ImageNotFound, RuntimeUnavailable, VolumeNotFound) as exc:
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
    # One guarded UPDATE: only a row still "creating" becomes "running", and nothing else
    # writes a "creating" row (every other update is guarded on its own state), so our copy
    # is the row. The clock starts when the sandbox does: endAt = start + timeout.
    now = timezone.now()
    changes = {
        "state": State.RUNNING,
        "state_changed_at": now,
        "started_at": now,
        "end_at": now + (sandbox.end_at - sandbox.started_at),
    }
    if Sandbox.objects.filter(pk=sandbox.pk, state=State.CREATING).update(**changes):
        for name, value in changes.items():
            setattr(sandbox, name, value)
        # After the row is running, with no transaction held: what its start command wrote
        # (read from the runtime), then the event; and the team's start, counted.
        sandbox_log_boot(
            sandbox_id=sandbox.sandbox_id,
            message=f"sandbox created from template '{sandbox.alias or template.template_id}'",
            event="created",
        )
        team_metrics_started(team_id=sandbox.team_id, now=now)
        return sandbox
    row = Sandbox.objects.select_related("template").filter(pk=sandbox.pk).first()
    if row is None or row.state in (State.KILLING, State.KILLED):
        # Killed while it was being created: make sure nothing runs.
        runtime.kill(sandbox.sandbox_id)
        raise not_found(sandbox.sandbox_id)
    return row  # another driver of the same id finished first


def sandbox_create(
    *,
    team: Team,
    request: CreateRequest,
    sandbox_id: str | None = None,
    reserved: Sandbox | None = None,
) -> Sandbox:
    """Create the sandbox ``sandbox_id`` (a new id when None), or adopt it if a previous
    attempt got any part of the way: safe to re-drive with the same id after a crash.
    ``reserved``: the row this request's own :func:`sandbox_reserve` committed for that id,
    which then need not be read back."""
    sandbox = reserved
    if sandbox is None and sandbox_id is not None:
        sandbox = (
            Sandbox.objects.select_related("template").filter(pk=sandbox_id, team=team).first()
        )
    if sandbox is None:
        placement()  # builds the runtime, if this process has none yet, outside the tx
        with transaction.atomic():
            sandbox = sandbox_reserve(team=team, request=request, sandbox_id=sandbox_id)
    node_for_sandbox(sandbox)  # a re-drive creates only where its row was reserved
    if sandbox.state == State.CREATING:
        # Read back only when the create named volumes: no statement otherwise.
        mounts = sandbox_mounts(sandbox) if request.volume_mounts else ()
        return sandbox_start(sandbox=sandbox, volume_mounts=mounts)
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


def sandbox_update_network(
    *, team: Team, sandbox_id: str, allow_internet: bool, network: dict[str, Any]
) -> None:
    """Replace a running (or paused) sandbox's egress rules, live. Idempotent: the same
    body twice leaves the same rules. Racing updates settle on the last one committed: the
    runtime is given the stored rules again until what it applied is what is stored."""
    sandbox = sandbox_get(team=team, sandbox_id=sandbox_id)
    runtime = sandbox_runtime(sandbox)
    if sandbox.state not in (State.RUNNING, State.PAUSED):
        raise Conflict(f'Sandbox "{sandbox_id}" is in {sandbox.wire_state} state')
    wanted = {k: v for k, v in network.items() if v is not None}
    if (sandbox.network or {}).get("maskRequestHost"):  # not an egress rule: kept
        wanted["maskRequestHost"] = sandbox.network["maskRequestHost"]
    check_rule_placeholders(
        team_id=team.pk,
        rules=wanted.get("rules"),
        tokens=set(((sandbox.iam or {}).get("tokens") or {}).keys()),
    )
    wanted, proxy_password = egress_proxy_split(wanted)
    Sandbox.objects.filter(pk=sandbox.pk).update(
        allow_internet_access=allow_internet, network=wanted, egress_proxy_password=proxy_password
    )
    for _ in range(3):
        row = (
            Sandbox.objects.filter(pk=sandbox.pk).values("allow_internet_access", "network").first()
        )
        if row is None:
            raise not_found(sandbox_id)
        applied = (row["allow_internet_access"], row["network"])
        try:
            runtime.update_network(sandbox_id, network_policy(*applied))
        except SandboxNotFound:
            raise not_found(sandbox_id) from None
        except SandboxRuntimeError as exc:
            raise runtime_error(exc) from exc
        now = (
            Sandbox.objects.filter(pk=sandbox.pk).values("allow_internet_access", "network").first()
        )
        if now is None or (now["allow_internet_access"], now["network"]) == applied:
            return


# --------------------------------------------------------------------------- lifecycle
def sandbox_pause(*, team: Team, sandbox_id: str, memory: bool = True) -> Sandbox:
    """running -> paused, keeping its memory (``memory``) or only its files, which a resume
    then cold-boots. A second pause answers 409 (the SDK reads it as "already paused")."""
    sandbox, _ = transition_claim(team=team, sandbox_id=sandbox_id, transition=PAUSE)
    runtime = sandbox_runtime(sandbox)
    try:
        transition_act(
            sandbox, State.PAUSING, State.RUNNING, runtime.pause, sandbox_id, memory=memory
        )
    except ApiError as exc:
        sandbox_log_event(
            sandbox_id, f"pause failed: {exc.message}", level=Level.ERROR, event="pause_failed"
        )
        raise
    mode = PauseMode.FULL if memory else PauseMode.FILESYSTEM
    sandbox = transition_finish(sandbox, State.PAUSING, State.PAUSED, **paused_fields(mode))
    sandbox_log_event(sandbox_id, f"paused at the caller's request, {KEPT[mode]}", event="paused")
    return sandbox


# What a pause kept, as its log entry says it.
KEPT = {
    PauseMode.FULL: "its processes and memory kept",
    PauseMode.FILESYSTEM: "its files kept (a resume cold-boots it)",
}


def _resume(sandbox: Sandbox, timeout: int, memory: bool) -> Sandbox:
    runtime = sandbox_runtime(sandbox)
    # A resume without memory, or of a sandbox that kept only its files, boots it anew:
    # its template's start command runs again, and what it writes is logged.
    cold = not memory or sandbox.pause_mode == PauseMode.FILESYSTEM
    try:
        transition_act(
            sandbox, State.RESUMING, State.PAUSED, runtime.resume, sandbox.sandbox_id, memory=memory
        )
    except ApiError as exc:
        message = f"resume failed: {exc.message}"
        if cold:
            sandbox_log_boot(
                sandbox_id=sandbox.sandbox_id,
                message=message,
                event="resume_failed",
                level=Level.ERROR,
            )
        else:
            sandbox_log_event(sandbox.sandbox_id, message, level=Level.ERROR, event="resume_failed")
        raise
    sandbox = transition_finish(
        sandbox,
        State.RESUMING,
        State.RUNNING,
        end_at=timezone.now() + timedelta(seconds=timeout),
        state_reason="",
    )
    if cold:
        sandbox_log_boot(
            sandbox_id=sandbox.sandbox_id,
            message="resumed: cold-booted from its files",
            event="resumed",
        )
    else:
        sandbox_log_event(sandbox.sandbox_id, "resumed with its memory", event="resumed")
    return sandbox


def sandbox_resume(*, team: Team, sandbox_id: str, timeout: int, memory: bool = True) -> Sandbox:
    """Legacy resume: paused -> running (201); already running -> 409. Without ``memory``
    a sandbox paused with its memory cold-boots instead (its processes are ended)."""
    check_timeout(timeout)
    sandbox, _ = transition_claim(team=team, sandbox_id=sandbox_id, transition=RESUME)
    return _resume(sandbox, timeout, memory)


def sandbox_connect(
    *, team: Team, sandbox_id: str, timeout: int, memory: bool = True
) -> tuple[Sandbox, bool]:
    """Running: extend the end time only (``max(endAt, now + timeout)``), 200. Paused:
    resume (a cold boot when it kept only its files, or without ``memory``), 201. Returns
    the sandbox and whether it was resumed."""
    check_timeout(timeout)
    sandbox, previous = transition_claim(team=team, sandbox_id=sandbox_id, transition=CONNECT)
    if previous == State.RUNNING:
        new_end = timezone.now() + timedelta(seconds=timeout)
        Sandbox.objects.filter(pk=sandbox.pk, end_at__lt=new_end).update(end_at=new_end)
        sandbox.refresh_from_db()
        return sandbox, False
    return _resume(sandbox, timeout, memory), True


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
    # Never a 204 for a kill this host cannot make: transition_claim checks the host.
    row, _ = transition_claim(team=team, sandbox_id=sandbox_id, transition=KILL, wait=False)
    if not sandbox_finish_kill(sandbox=row):
        raise not_found(sandbox_id)  # a concurrent caller's kill recorded it first


def sandbox_finish_kill(*, sandbox: Sandbox, reason: str = "at the caller's request") -> bool:
    """Kill in the runtime, then record ``killed`` fenced on ``killing``, and log it with
    ``reason``. Returns whether this call's record landed (False: another caller's kill
    recorded it first)."""
    try:
        sandbox_runtime(sandbox).kill(sandbox.sandbox_id)
    except (SandboxRuntimeError, OSError) as exc:
        # Stay in "killing": the worker re-drives it. The caller learns it did not finish.
        raise runtime_error(exc) from exc
    now = timezone.now()
    recorded = Sandbox.objects.filter(pk=sandbox.pk, state=State.KILLING).update(
        state=State.KILLED, state_changed_at=now, killed_at=now
    )
    if recorded:
        sandbox_log_event(sandbox.sandbox_id, f"killed {reason}", event="killed")
    return bool(recorded)


def sandbox_metrics(*, team: Team, sandbox_id: str) -> dict[str, object]:
    sandbox = sandbox_get(team=team, sandbox_id=sandbox_id)
    runtime = sandbox_runtime(sandbox)
    try:
        m = runtime.metrics(sandbox.sandbox_id)
    except SandboxNotFound as exc:
        raise not_found(sandbox_id) from exc
    except SandboxRuntimeError as exc:
        raise runtime_error(exc) from exc
    return _metric(sandbox, m, timezone.now())


# E2B's bound on GET /sandboxes/metrics?sandbox_ids=...
METRICS_IDS_MAX = 100


def sandboxes_metrics(*, team: Team, sandbox_ids: list[str]) -> dict[str, dict[str, object]]:
    """E2B's batch metrics: a metric, taken now, for each of ``sandbox_ids`` (at most
    :data:`METRICS_IDS_MAX`) that is the team's, live and on this host. Another team's, an
    unknown or a killed id is left out, as E2B leaves it out (no 404 for one of many). One
    query finds the rows; each metric is then one runtime read, with no transaction held."""
    if len(sandbox_ids) > METRICS_IDS_MAX:
        raise BadRequest(
            f"sandbox_ids names {len(sandbox_ids)} sandboxes: at most {METRICS_IDS_MAX}"
        )
    node = local_node()
    rows = list(
        Sandbox.objects.of_team(team.pk)
        .live()
        .on_host(node.host_id)
        .filter(pk__in=sandbox_ids)
        .only("sandbox_id", "disk_size_mb")
    )
    runtime = runtime_for(node)
    now = timezone.now()
    out: dict[str, dict[str, object]] = {}
    order = {sandbox_id: i for i, sandbox_id in enumerate(sandbox_ids)}
    for sandbox in sorted(rows, key=lambda r: order[r.sandbox_id]):
        try:
            out[sandbox.sandbox_id] = _metric(sandbox, runtime.metrics(sandbox.sandbox_id), now)
        except SandboxNotFound:
            continue  # killed since the query: as if it had not been named
        except SandboxRuntimeError as exc:
            raise runtime_error(exc) from exc
    return out


def _metric(sandbox: Sandbox, m: Metrics, now: datetime) -> dict[str, object]:
    """E2B's ``SandboxMetric`` from one runtime sample."""
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
