"""The build state machine's writes from the API: request (``waiting``), trigger
(``building``), status and logs; the worker side is :mod:`.worker`.

Replays are safe: a repeated request makes a new ``waiting`` build and supersedes the one
before (as E2B does); a repeated trigger with the same body answers 202 again; a trigger
with another body of a build already started is E2B's 400.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from e2bfacade import crypto
from e2bfacade.errors import ApiError, AtCapacity, BadRequest, ServiceUnavailable
from e2bfacade.models import Team
from e2bfacade.runtime.base import SandboxRuntimeError
from nodes.selectors import Node, local_node, node_capacity
from templates.builds import names, wakeup
from templates.models import (
    DEFAULT_TAG,
    BuildLogEntry,
    BuildStatus,
    Template,
    TemplateBuild,
)

SUPERSEDED = "The build was canceled because it was superseded by a newer one."
# A build's files are uploaded between its request and its trigger: an hour is plenty.
WAITING_SECONDS = 3600
NEVER_STARTED = f"The build was never started (no trigger within {WAITING_SECONDS} s)."
CANCELED = "The build was canceled because a newer build of the template started."
CANCELED_BY_OPERATOR = "The build was canceled by the operator."
STEP_TYPES = ("RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER")
MAX_STEPS = 512
MAX_SPEC_BYTES = 1 << 20
LOG_PAGE = 100
LEVELS = ("debug", "info", "warn", "error")


class Forbidden(ApiError):
    status = 403


class TooManyBuilds(AtCapacity):
    pass


@dataclass(frozen=True)
class Requested:
    template: Template
    build: TemplateBuild
    tags: list[str]


def check_shape(cpu_count: object, memory_mb: object) -> tuple[int, int]:
    """E2B's CPU and memory rules, with its messages."""
    cpu = 2 if cpu_count is None else cpu_count
    memory = 1024 if memory_mb is None else memory_mb
    if not isinstance(cpu, int) or isinstance(cpu, bool) or not 1 <= cpu <= 32:
        raise BadRequest("CPU count must be between 1 and 32")
    if cpu != 1 and cpu % 2:
        raise BadRequest("CPU count must be 1 or an even number")
    if not isinstance(memory, int) or isinstance(memory, bool) or memory < 128:
        raise BadRequest("Memory must be at least 128 MiB")
    if memory % 2:
        raise BadRequest("Memory must be divisible by 2")
    return cpu, memory


def build_request_body(body: dict[str, Any]) -> dict[str, Any]:
    """``POST /v3/templates``'s body checked (400s with E2B's texts) and made canonical:
    what an Idempotency-Key's fingerprint covers and what a re-drive runs again."""
    raw_name = body.get("name") or body.get("alias")
    name = names.parse(raw_name)
    tags = names.tags(body.get("tags") or [], first=name.tag) or [DEFAULT_TAG]
    cpu, memory = check_shape(body.get("cpuCount"), body.get("memoryMB"))
    _check_fits(name.name, cpu, memory)
    return {"name": str(raw_name).strip(), "tags": tags, "cpuCount": cpu, "memoryMB": memory}


def build_request(
    *, team: Team, body: dict[str, Any], build_id: uuid.UUID | None = None
) -> Requested:
    """``POST /v3/templates`` (``body`` as :func:`build_request_body` made it): the template
    (made on first use of its name) and a new ``waiting`` build that will carry the tags.

    Idempotent by ``build_id`` (an Idempotency-Key's reserved id): a build of that id
    already made is answered again, never a second one; a concurrent driver of the same id
    loses the insert and answers the winner's."""
    if build_id is not None and (done := _requested(team, build_id)) is not None:
        return done
    name = names.parse(body["name"])
    tags, cpu, memory = list(body["tags"]), int(body["cpuCount"]), int(body["memoryMB"])
    _expire_waiting(team)
    try:
        return _request(team, name.name, tags, cpu, memory, build_id or uuid.uuid4())
    except IntegrityError:
        if build_id is None or (done := _requested(team, build_id)) is None:
            raise
        return done


def _requested(team: Team, build_id: uuid.UUID) -> Requested | None:
    build = TemplateBuild.objects.select_related("template").filter(pk=build_id, team=team).first()
    return None if build is None else Requested(build.template, build, list(build.tags))


def _request(
    team: Team, name: str, tags: list[str], cpu: int, memory: int, build_id: uuid.UUID
) -> Requested:
    with transaction.atomic():
        template = _template_for(team, name, cpu, memory)
        active = TemplateBuild.objects.filter(
            team=team, status__in=(BuildStatus.WAITING, BuildStatus.BUILDING)
        )
        # Superseded below, so they do not count against the limit.
        superseded = [
            b
            for b in active.filter(template=template, status=BuildStatus.WAITING)
            if set(b.tags) & set(tags)
        ]
        if active.count() - len(superseded) >= settings.TEMPLATE_BUILDS_PER_TEAM:
            raise TooManyBuilds(
                "you have reached the maximum number of concurrent template builds "
                f"({settings.TEMPLATE_BUILDS_PER_TEAM}). Please wait for existing builds to "
                "complete or contact support if you need more concurrent builds."
            )
        for old in superseded:
            finish_error(old, SUPERSEDED, step=None)
        build = TemplateBuild.objects.create(
            build_id=build_id,
            template=template,
            team=team,
            status=BuildStatus.WAITING,
            cpu_count=cpu,
            memory_mb=memory,
            tags=tags,
        )
    return Requested(template, build, tags)


def _expire_waiting(team: Team) -> None:
    """End the team's builds requested but never triggered within WAITING_SECONDS (a
    client that died between its request and its trigger): they would count against the
    team's limit for ever."""
    cutoff = timezone.now() - timedelta(seconds=WAITING_SECONDS)
    for build in TemplateBuild.objects.filter(
        team=team, status=BuildStatus.WAITING, created_at__lt=cutoff
    ):
        finish_error(build, NEVER_STARTED, step=None)


def _this_host() -> str:
    return _node().host_id


def _node() -> Node:
    """The node that runs a build (this one: its archives are here), or a 503 saying why
    it has no runtime (a build needs its host's)."""
    try:
        node = local_node()
        node_capacity(node)
    except SandboxRuntimeError as exc:
        raise ServiceUnavailable(
            f"template builds are unavailable on this host: {exc.message}",
            headers={"Retry-After": "5"},
        ) from exc
    return node


def _check_fits(name: str, cpu: int, memory: int) -> None:
    from templates.services import DEFAULT_PIDS_MAX, template_fits

    template_fits(
        node_capacity(_node()),
        name=name,
        cpu_count=cpu,
        memory_mb=memory,
        pids_max=DEFAULT_PIDS_MAX,
        disk_size_mb=1024,
    )


def _template_for(team: Team, name: str, cpu: int, memory: int) -> Template:
    """The team's template of that name, locked; made (without an image) on first use. A
    public template's name, or another template's id, is not the team's to build."""
    if Template.objects.filter(Q(team__isnull=True, alias=name) | Q(template_id=name)).exists():
        raise Forbidden(f"Alias '{name}' already used")
    template = Template.objects.select_for_update().filter(team=team, alias=name).first()
    if template is not None:
        if template.kind != Template.Kind.TEMPLATE:
            raise Forbidden(f"Alias '{name}' already used")
        return template
    try:
        with transaction.atomic():
            # The first build's shape until a build of its ``default`` tag sets it.
            return Template.objects.create(
                team=team, alias=name, image_id="", cpu_count=cpu, memory_mb=memory
            )
    except IntegrityError:  # a concurrent request made it first
        return Template.objects.select_for_update().get(team=team, alias=name)


def resolve_build(*, team: Team, template_ref: str, build_id: str) -> TemplateBuild:
    try:
        key = uuid.UUID(build_id)
    except ValueError:
        raise BadRequest(f"Invalid build ID '{build_id}'") from None
    build = TemplateBuild.objects.select_related("template").filter(pk=key).first()
    if build is None:
        raise BadRequest(f"Build '{build_id}' not found")
    if build.team_id != team.pk:
        raise Forbidden("User does not have access to the template")
    template = build.template
    if template_ref not in (template.template_id, template.alias):
        raise BadRequest(f"Build '{build_id}' not found")
    return build


def spec_of(body: dict[str, Any]) -> dict[str, Any]:
    """The trigger's body as stored: checked in shape, credentials left out."""
    if len(json.dumps(body)) > MAX_SPEC_BYTES:
        raise BadRequest(f"the build's steps exceed {MAX_SPEC_BYTES} bytes")
    image, parent = body.get("fromImage"), body.get("fromTemplate")
    if bool(image) == bool(parent):
        raise BadRequest("exactly one of fromImage and fromTemplate is required")
    for key, value in (("fromImage", image), ("fromTemplate", parent)):
        if value is not None and (not isinstance(value, str) or len(value) > 512):
            raise BadRequest(f"{key} must be a string")
    steps = body.get("steps") or []
    if not isinstance(steps, list) or len(steps) > MAX_STEPS:
        raise BadRequest(f"steps must be a list of at most {MAX_STEPS} steps")
    clean = []
    for n, step in enumerate(steps, 1):
        if not isinstance(step, dict):
            raise BadRequest(f"step {n} must be an object")
        kind = str(step.get("type", "")).upper()
        args = step.get("args") or []
        if kind not in STEP_TYPES:
            raise BadRequest(f"step {n}: command type {step.get('type')!r} is not implemented")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise BadRequest(f"step {n}: args must be a list of strings")
        files_hash = step.get("filesHash")
        if files_hash is not None and not isinstance(files_hash, str):
            raise BadRequest(f"step {n}: filesHash must be a string")
        clean.append(
            {"type": kind, "args": args, "force": bool(step.get("force")), "filesHash": files_hash}
        )
    for key in ("startCmd", "readyCmd"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise BadRequest(f"{key} must be a string")
    return {
        "fromImage": image,
        "fromTemplate": parent,
        "force": bool(body.get("force")),
        "steps": clean,
        "startCmd": body.get("startCmd"),
        "readyCmd": body.get("readyCmd"),
    }


def build_submit_system(
    *,
    template: Template,
    team: Team,
    body: dict[str, Any],
    tags: list[str],
    cpu_count: int,
    memory_mb: int,
) -> TemplateBuild:
    """A build the service makes of one of its public templates (``code-interpreter-v1``):
    no request and no trigger, it is ``building`` at once with the steps of ``body`` (a
    trigger's body), owned by ``team``, the system team no API key reaches; the build
    worker runs it as any other. A build of the template already running with the same
    steps is answered (two makers of one build run it once); one with other steps is
    canceled, as a trigger cancels its template's running builds."""
    if template.team_id is not None or not team.system:
        raise ValueError("a system build is of a public template, by the system team")
    spec = spec_of(body)
    digest = hashlib.sha256(json.dumps([spec, None], sort_keys=True).encode()).hexdigest()
    host = _this_host()  # the runtime is asked outside the transaction, never within
    with transaction.atomic():
        # The template's row orders concurrent submits: the second sees the first's build.
        Template.objects.select_for_update().filter(pk=template.pk).first()
        for running in TemplateBuild.objects.select_for_update().filter(
            template=template, status=BuildStatus.BUILDING
        ):
            if running.spec_digest == digest:
                return running
            finish_error(running, CANCELED, step=None)
        build = TemplateBuild.objects.create(
            template=template,
            team=team,
            status=BuildStatus.BUILDING,
            cpu_count=cpu_count,
            memory_mb=memory_mb,
            tags=tags,
            spec=spec,
            spec_digest=digest,
            started_at=timezone.now(),
            host=host,  # its archives are on this host: only its workers run it
        )
        wakeup.announce()
    return build


def _registry_auth(body: dict[str, Any]) -> bytes | None:
    auth = body.get("fromImageRegistry")
    if auth is None:
        return None
    if not isinstance(auth, dict) or not isinstance(auth.get("type"), str):
        raise BadRequest("fromImageRegistry must be an object with a type")
    return crypto.encrypt(json.dumps(auth).encode())


def spec_digest(spec: dict[str, Any], registry_auth: object) -> str:
    """What recognises a replay of a trigger while its build runs: an HMAC of the spec and
    the credentials under a key derived from SECRET_KEY (as the service derives its other
    keys), so the stored value cannot be used to test guessed passwords without the secret.
    Cleared when the build ends (``finish_error``, the worker's ready)."""
    key = hashlib.sha256(b"e2bfacade.build-spec:" + settings.SECRET_KEY.encode()).digest()
    message = json.dumps([spec, registry_auth], sort_keys=True).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _is_replay(build: TemplateBuild, spec: dict[str, Any], digest: str) -> bool:
    """Whether a trigger of a build no longer waiting is the one that started it: by its
    digest while it runs; once it has ended, by its spec alone (nothing of the credentials
    is kept then, so a replay with other credentials is answered the same — it starts
    nothing)."""
    if build.spec_digest:
        return hmac.compare_digest(build.spec_digest, digest)
    return build.status in (BuildStatus.READY, BuildStatus.ERROR) and build.spec == spec


def build_trigger(
    *, team: Team, template_ref: str, build_id: str, body: dict[str, Any]
) -> TemplateBuild:
    """``POST /v2/templates/{id}/builds/{buildID}``: store the steps and make the build
    ``building`` (the build worker takes it from there); the running builds of the same
    template are canceled."""
    spec = spec_of(body)
    digest = spec_digest(spec, body.get("fromImageRegistry"))
    auth = _registry_auth(body)
    # The host whose API received the trigger holds the build's archives (the SDK uploads
    # them through the same API): only its build workers claim the build. Read before the
    # transaction: the runtime is built on first use.
    host = _this_host()
    with transaction.atomic():
        build = resolve_build(team=team, template_ref=template_ref, build_id=build_id)
        build = TemplateBuild.objects.select_for_update().get(pk=build.pk)
        if build.status != BuildStatus.WAITING:
            if _is_replay(build, spec, digest):
                return build  # a replay of the trigger that started it
            raise BadRequest("build is not in waiting state")
        for running in TemplateBuild.objects.select_for_update().filter(
            template_id=build.template_id, status=BuildStatus.BUILDING
        ):
            finish_error(running, CANCELED, step=None)
        build.spec, build.spec_digest, build.registry_auth = spec, digest, auth
        build.status, build.started_at, build.host = BuildStatus.BUILDING, timezone.now(), host
        build.save(
            update_fields=["spec", "spec_digest", "registry_auth", "status", "started_at", "host"]
        )
        wakeup.announce()
    return build


def finish_error(
    build: TemplateBuild, message: str, *, step: str | None, owner: str | None = None
) -> bool:
    """End a build ``error`` with ``message`` (at ``step``), unless it already ended (or,
    with ``owner``, a build worker's, unless another worker holds its lease now: a worker
    that stalled past its lease must not end the build its successor is running); the
    last log entry says so. Returns whether this call ended it."""
    now = timezone.now()
    fence = Q(lease_owner=owner) if owner is not None else Q()
    updated = TemplateBuild.objects.filter(
        fence, pk=build.pk, status__in=(BuildStatus.WAITING, BuildStatus.BUILDING)
    ).update(
        status=BuildStatus.ERROR,
        reason={"message": message, **({"step": step} if step else {})},
        finished_at=now,
        registry_auth=None,
        spec_digest="",
        lease_owner="",
        lease_until=None,
    )
    if updated:
        append_log(build, f"Build failed: {message}", level="error", step=step or "")
    return bool(updated)


def builds_cancel_team(*, team: Team) -> tuple[int, int]:
    """End every waiting or building build of ``team`` ``error`` (E2B's admin cancel).
    Returns (cancelled, failed). Each end is one guarded UPDATE, so ``failed`` is 0: the
    build worker running one sees its lease gone at its next renewal and ends the build's
    sandbox then. A build that finished meanwhile is neither. Safe to repeat."""
    cancelled = 0
    builds = TemplateBuild.objects.filter(
        team=team, status__in=(BuildStatus.WAITING, BuildStatus.BUILDING)
    ).order_by("created_at")
    for build in builds:
        if finish_error(build, CANCELED_BY_OPERATOR, step=None):
            cancelled += 1
    return cancelled, 0


def append_log(build: TemplateBuild, *lines: str, level: str = "info", step: str = "") -> bool:
    """Append entries to the build's log, numbered on; past TEMPLATE_BUILD_LOG_ENTRIES one
    last entry says the rest was dropped. Returns whether the log still has room."""
    cap = settings.TEMPLATE_BUILD_LOG_ENTRIES
    with transaction.atomic():
        last = (
            BuildLogEntry.objects.select_for_update()
            .filter(build=build)
            .order_by("-seq")
            .values_list("seq", flat=True)
            .first()
        )
        seq = -1 if last is None else last
        now = timezone.now()
        rows = []
        for line in lines:
            seq += 1
            if seq > cap:
                break
            if seq == cap:
                line, level = f"the log is over {cap} entries; the rest is not kept", "warn"
            rows.append(
                BuildLogEntry(
                    build=build, seq=seq, timestamp=now, level=level, step=step, message=line
                )
            )
        BuildLogEntry.objects.bulk_create(rows)
    return seq < cap


def log_entries(build: TemplateBuild, *, offset: int, limit: int, level: str | None) -> list[Any]:
    qs = BuildLogEntry.objects.filter(build=build).order_by("seq")
    if level:
        qs = qs.filter(level__in=LEVELS[LEVELS.index(level) :])
    return [_entry(e) for e in qs[offset : offset + limit]]


def _entry(e: BuildLogEntry) -> dict[str, Any]:
    return {
        "timestamp": e.timestamp.isoformat().replace("+00:00", "Z"),
        "level": e.level,
        "message": e.message,
        "step": e.step or None,
    }


def build_status(
    build: TemplateBuild, *, offset: int, limit: int, level: str | None
) -> dict[str, Any]:
    """``TemplateBuildInfo``: ``reason`` only when there is one (``null`` crashes the SDK)."""
    info: dict[str, Any] = {
        "templateID": build.template_id,
        "buildID": str(build.build_id),
        "status": build.status,
        "logs": [],
        "logEntries": log_entries(build, offset=offset, limit=limit, level=level),
    }
    if build.reason:
        reason = dict(build.reason)
        step = reason.get("step")
        warn = BuildLogEntry.objects.filter(build=build, level__in=("warn", "error"))
        if step:
            warn = warn.filter(step=step)
        reason["logEntries"] = [_entry(e) for e in warn.order_by("seq")[:LOG_PAGE]]
        info["reason"] = reason
    return info
