"""Volume writes: create, delete, the worker's sweep, and resolving a sandbox create's
``volumeMounts`` (E2B's volumes; the storage is the runtime's, ``e2bfacade.runtime.volumes``).

Every change of a volume is claim / act / finish: a short transaction records the intent
(the row inserted ``creating``, or moved to ``deleting``), the runtime acts with no
transaction held, a second write records the outcome. The runtime's volume operations are
idempotent by id, so a crash anywhere leaves a row that is driven to its end: a create by a
retry with the same Idempotency-Key (the reserved id is re-driven) or, unkeyed, removed by
the worker's sweep (nobody was handed its id); a delete by any retried DELETE or the sweep.
Only ``ready`` volumes are listed, answered, mounted or served: nothing half-made is
visible.
"""

from __future__ import annotations

import logging
import posixpath
import re
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Sum
from django.utils import timezone

from e2bfacade import capabilities, observability
from e2bfacade.errors import ApiError, BadRequest, NotFound, NothingAllocated, ServiceUnavailable
from e2bfacade.failpoints import failpoint
from e2bfacade.models import Team
from e2bfacade.runtime.base import Capability, SandboxRuntimeError
from e2bfacade.runtime.volumes import MAX_MOUNTS_PER_SANDBOX, VolumeInUse, VolumeRuntime
from idempotency.models import IdempotencyRecord
from nodes.selectors import (
    Node,
    local_node,
    local_runtime,
    node_for_volume,
    node_named,
    runtime_for,
)
from sandboxes.admission import volume_admit
from sandboxes.models import SandboxVolumeMount, Volume

logger = logging.getLogger(__name__)
State = Volume.State

VOLUME_NAME = re.compile(r"[a-zA-Z0-9_-]+")  # E2B's
MAX_NAME = 255  # the column's
MAX_PATH = 1024  # bytes: the runtime's bound (a mount point is passed to the launcher)
# The runtime's storage of a volume no row names is removed once made this long ago. A
# create inserts (and commits) its row before it makes the storage, and the sweep lists the
# storage before it reads the rows, so storage it finds without a row has lost it; the
# grace covers clocks and a listing slower than a create.
ORPHAN_GRACE = timedelta(minutes=1)


class VolumeBudgetExceeded(BadRequest):
    """The team's volumes together would allocate more than VOLUME_MAX_MB_PER_TEAM. A limit,
    not an answer: an Idempotency-Key is released, so the same key may create once another
    volume is deleted."""

    releases_key = True
    error_code = "volume_budget_exceeded"


# ------------------------------------------------------------------------------ helpers
def volume_runtime(volume: Volume | None = None) -> VolumeRuntime:
    """The runtime as volumes need it — ``volume``'s node's (a 503 for a volume another host
    stores, :func:`nodes.selectors.node_for_volume`), else this node's — built outside any
    transaction (call it first). Without :attr:`Capability.VOLUME_MOUNTS` a create or a
    delete answers 403, as E2B does while volumes are not enabled (the reads answer from
    the database)."""
    node = None if volume is None else node_for_volume(volume)
    message = capabilities.refusal(Capability.VOLUME_MOUNTS)
    if message:
        raise ApiError(message, status=403, error_code="volumes_not_supported")
    try:
        return cast(VolumeRuntime, runtime_for(node or local_node()))
    except SandboxRuntimeError as exc:  # this host cannot run its runtime at all
        raise ServiceUnavailable(exc.message, headers={"Should-Retry": "false"}) from exc


def volume_not_found() -> NotFound:
    return NotFound("Volume not found")  # E2B's text


def parse_volume_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise BadRequest("Invalid volume ID") from None  # E2B's text


def check_name(name: str) -> None:
    if not VOLUME_NAME.fullmatch(name):
        raise BadRequest("Invalid volume name")  # E2B's text
    if len(name) > MAX_NAME:
        raise BadRequest(f"Invalid volume name: at most {MAX_NAME} characters")


# What a runtime's volume operation may raise: its own errors, and the host's (a full disk,
# a missing loop device) when they reach us unwrapped.
STORAGE_ERRORS = (SandboxRuntimeError, OSError)


def _storage_error(exc: Exception) -> ServiceUnavailable:
    return ServiceUnavailable(f"volume storage error: {exc}")


def _in_use(volume: Volume, sandbox_ids: Sequence[str]) -> BadRequest:
    named = f" (sandbox {', '.join(sandbox_ids)})" if sandbox_ids else ""
    return BadRequest(
        f"Volume '{volume.name}' is mounted by a sandbox that is not killed{named}: kill the "
        "sandboxes that mount it, then delete it",
        error_code="volume_in_use",
    )


# ------------------------------------------------------------------------------- create
def volume_reserve(*, team: Team, name: str, volume_id: str) -> Volume:
    """Insert the volume row ``creating``: the intent is durable before any storage exists.
    Refusals (a taken name, the team's budget) are raised before anything is written. Runs
    inside the caller's transaction (idempotency's claim, or :func:`volume_create`'s)."""
    check_name(name)
    # The team's row lock serialises the team's volume creates (and its sandbox admissions,
    # which take the same lock), so the name and budget checks and the insert that follows
    # cannot interleave with another create's.
    list(Team.objects.select_for_update().filter(pk=team.pk).values_list("pk"))
    if Volume.objects.filter(team=team, name=name).exists():
        raise BadRequest(f"Volume with name '{name}' already exists")  # E2B's text
    size = settings.VOLUME_MAX_MB
    budget = settings.VOLUME_MAX_MB_PER_TEAM
    allocated = Volume.objects.filter(team=team).aggregate(total=Sum("size_mb"))["total"] or 0
    if allocated + size > budget:
        raise VolumeBudgetExceeded(
            f"the team's volumes may allocate at most {budget} MB together; {allocated} MB "
            f"are allocated and a new volume takes {size} MB: delete a volume first"
        )
    node = volume_admit(size_mb=size)  # the host's disk holds it beside sandboxes and volumes
    now = timezone.now()
    try:
        with transaction.atomic():  # a savepoint: the unique constraint stays the arbiter
            return Volume.objects.create(
                volume_id=uuid.UUID(volume_id),
                team=team,
                name=name,
                state=State.CREATING,
                state_changed_at=now,
                size_mb=size,
                host=node.host_id,
            )
    except IntegrityError:
        raise BadRequest(f"Volume with name '{name}' already exists") from None


def volume_start(*, volume: Volume) -> Volume:
    """Drive a ``creating`` volume to ``ready``: the runtime makes its storage (idempotent
    by id), then one guarded UPDATE publishes it. Safe to call again for the same row.

    A runtime failure rolls the storage back: when that worked, the row goes too and
    :class:`NothingAllocated` is raised (an Idempotency-Key is released); when it did not,
    the row stays ``creating`` for a retry with the key, or the sweep, to finish."""
    runtime = volume_runtime(volume)  # only the volume's host makes its storage
    try:
        runtime.create_volume(volume.runtime_id, volume.size_mb)
    except STORAGE_ERRORS as exc:
        try:
            runtime.delete_volume(volume.runtime_id)
        except STORAGE_ERRORS:
            logger.warning("volume %s: cannot roll back a failed create", volume.pk, exc_info=True)
            raise _storage_error(exc) from exc
        Volume.objects.filter(pk=volume.pk, state=State.CREATING).delete()
        raise NothingAllocated(
            f"the volume's storage could not be made: {exc}", headers={"Should-Retry": "false"}
        ) from exc
    failpoint("after_volume_create")
    now = timezone.now()
    if Volume.objects.filter(pk=volume.pk, state=State.CREATING).update(
        state=State.READY, state_changed_at=now
    ):
        volume.state, volume.state_changed_at = State.READY, now
        return volume
    row = Volume.objects.filter(pk=volume.pk).first()
    if row is not None and row.state == State.READY:
        return row  # another driver of the same id finished first
    # The sweep took it for abandoned (it was "creating" for longer than the worker's
    # stale-after) and is removing it.
    raise ServiceUnavailable(
        "the volume was removed while it was being created: create it again",
        headers={"Should-Retry": "false"},
    )


def volume_create(
    *, team: Team, name: str, volume_id: str | None = None, reserved: Volume | None = None
) -> Volume:
    """Create the volume ``volume_id`` (a new id when None), or adopt it if an earlier
    attempt got any part of the way: safe to re-drive with the same id after a crash.
    ``reserved``: the row this request's own :func:`volume_reserve` committed."""
    volume = reserved
    if volume is None and volume_id is not None:
        volume = Volume.objects.filter(pk=volume_id, team=team).first()
    if volume is None:
        volume_runtime()  # builds the runtime, if this process has none yet, outside the tx
        with transaction.atomic():
            volume = volume_reserve(team=team, name=name, volume_id=volume_id or str(uuid.uuid4()))
    if volume.state == State.CREATING:
        return volume_start(volume=volume)
    if volume.state == State.DELETING:
        raise volume_not_found()
    return volume


# -------------------------------------------------------------------------------- reads
def volume_get(*, team: Team, volume_id: str) -> Volume:
    """A ready volume of the team: 400 for an id that is not a UUID, 404 for anything else
    that is not one (another team's, unknown, being created or deleted)."""
    pk = parse_volume_id(volume_id)
    volume = Volume.objects.filter(pk=pk, team=team, state=State.READY).first()
    if volume is None:
        raise volume_not_found()
    return volume


# ------------------------------------------------------------------------------- delete
def volume_delete(*, team: Team, volume_id: str) -> None:
    """Delete a ready volume and its storage. Refused (400) while a sandbox that is not
    killed mounts it. Safe to retry: a delete that died half-way left the row ``deleting``,
    which the next DELETE (or the sweep) finishes."""
    pk = parse_volume_id(volume_id)
    volume_runtime()  # built outside the transaction
    here = local_node()
    with transaction.atomic():
        # Locked: a create mounting it locks it too (volume_mounts_resolve), so either that
        # sandbox's mount is committed and seen here, or the create sees "deleting".
        volume = (
            Volume.objects.select_for_update()
            .filter(pk=pk, team=team)
            .exclude(state=State.CREATING)
            .first()
        )
        if volume is None:
            raise volume_not_found()
        node_for_volume(volume, local=here)  # 503 for a volume another host stores
        if volume.state == State.READY:
            users = list(volume.live_mounts().values_list("sandbox_id", flat=True)[:5])
            if users:
                raise _in_use(volume, users)
            volume.state, volume.state_changed_at = State.DELETING, timezone.now()
            volume.save(update_fields=["state", "state_changed_at"])
    volume_finish_delete(volume=volume)


def volume_finish_delete(*, volume: Volume) -> None:
    """Remove a ``deleting`` volume's storage, then its row (and the mounts killed
    sandboxes recorded). Idempotent."""
    runtime = volume_runtime(volume)
    try:
        runtime.delete_volume(volume.runtime_id)
    except VolumeInUse as exc:
        # The runtime knows a live sandbox the database does not: give the volume back.
        Volume.objects.filter(pk=volume.pk, state=State.DELETING).update(
            state=State.READY, state_changed_at=timezone.now()
        )
        raise _in_use(volume, []) from exc
    except STORAGE_ERRORS as exc:
        raise _storage_error(exc) from exc  # stays "deleting": a retry or the sweep finishes
    failpoint("after_volume_delete")
    with transaction.atomic():
        SandboxVolumeMount.objects.filter(volume_id=volume.pk).delete()
        Volume.objects.filter(pk=volume.pk, state=State.DELETING).delete()


def volume_revoke_tokens(*, volume_ids: Sequence[uuid.UUID]) -> int:
    """Revoke every token minted so far for these volumes (the content API refuses them at
    once); ``GET /volumes/{id}`` mints valid ones again. Returns how many volumes."""
    return Volume.objects.filter(pk__in=volume_ids).update(token_epoch=F("token_epoch") + 1)


# -------------------------------------------------------------------------------- sweep
def volume_sweep(*, older_than: datetime, orphans_made_before: datetime | None = None) -> list[str]:
    """The worker's part, on this host's volumes: finish the deletes a dead process left
    ``deleting``, and remove the volumes an unkeyed create left ``creating`` (its creator
    died before answering, so nobody was handed its id; nothing could be written to it).
    A keyed create is idempotency's to re-drive. Returns the ids it removed. Then removes
    the runtime's orphaned storage (:func:`volume_sweep_orphans`), which it logs itself."""
    removed = volume_sweep_rows(older_than=older_than)
    volume_sweep_orphans(made_before=orphans_made_before)
    return removed


def volume_sweep_rows(*, older_than: datetime) -> list[str]:
    removed = []
    host = local_node().host_id
    stale = Volume.objects.filter(
        host__in=[host, ""],
        state__in=[State.CREATING, State.DELETING],
        state_changed_at__lt=older_than,
    ).values_list("pk", flat=True)
    for pk in list(stale[:100]):
        if IdempotencyRecord.objects.filter(
            resource_id=str(pk), state=IdempotencyRecord.State.IN_PROGRESS
        ).exists():
            continue
        with transaction.atomic():
            row = (
                Volume.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, state_changed_at__lt=older_than)
                .exclude(state=State.READY)
                .first()
            )
            if row is None:
                continue
            row.state, row.state_changed_at = State.DELETING, timezone.now()
            row.save(update_fields=["state", "state_changed_at"])
        try:
            volume_finish_delete(volume=row)
        except ApiError as exc:
            logger.warning("volume %s: the sweep could not remove it: %s", pk, exc.message)
            continue
        removed.append(str(pk))
    return removed


def volume_sweep_orphans(*, made_before: datetime | None = None) -> list[str]:
    """Remove this host's volume storage that no volume row names, in any state and on any
    host (a team's delete cascades to its rows and leaves the storage; so does a row lost
    any other way), made before ``made_before`` (default: :data:`ORPHAN_GRACE` ago). Storage
    a live sandbox's record still mounts is kept (the runtime's delete refuses it) until
    that sandbox ends. Ids that are not UUIDs are not the control plane's: never touched.
    Logs and counts each removal; returns the ids removed."""
    if capabilities.refusal(Capability.VOLUME_MOUNTS):
        return []
    runtime = cast(VolumeRuntime, local_runtime())
    cutoff = made_before or timezone.now() - ORPHAN_GRACE
    try:
        listed = runtime.volume_ids(made_before=cutoff.timestamp())  # before the rows
    except STORAGE_ERRORS:
        logger.warning("volume sweep: cannot list the runtime's volumes", exc_info=True)
        return []
    ids: dict[uuid.UUID, str] = {}
    for raw in listed:
        try:
            ids[uuid.UUID(raw)] = raw
        except ValueError:
            continue
    named = set(Volume.objects.filter(pk__in=list(ids)).values_list("pk", flat=True))
    removed = []
    for pk in sorted(set(ids) - named)[:100]:
        raw = ids[pk]
        try:
            runtime.delete_volume(raw)
        except VolumeInUse:
            logger.info("volume %s: no row names it, but a live sandbox mounts it: kept", raw)
            continue
        except STORAGE_ERRORS:
            logger.warning("volume %s: cannot remove its orphaned storage", raw, exc_info=True)
            continue
        logger.warning("volume %s: removed its storage, which no volume row names", raw)
        observability.volume_orphan_removed()
        removed.append(raw)
    return removed


# ------------------------------------------------------------------------------- mounts
def clean_path(path: str) -> str:
    """Go's ``filepath.Clean`` of an absolute path (E2B compares a mount path with it):
    ``posixpath.normpath``, which also keeps a leading ``//``, which Clean does not."""
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def mount_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a mount point (E2B's reasons first), or None."""
    if path == "":
        return "path cannot be empty"
    if not path.startswith("/"):
        return "path must be absolute"
    if clean_path(path) != path:
        return "path must not contain any '.' or '..' components"
    if path == "/":
        return "path cannot be the root directory"
    if len(path.encode()) > MAX_PATH:
        return f"path must be at most {MAX_PATH} bytes"
    return None


def volume_mounts_resolve(
    *, team: Team, mounts: Sequence[tuple[str, str]], node: Node
) -> list[tuple[Volume, str]]:
    """A create's ``volumeMounts`` as ``(volume, path)``, validated as E2B does (each volume
    exists in the team, each path is absolute and clean, no path twice) and on ``node``,
    the node the sandbox is placed on.
    Every problem is reported at once, in E2B's text. The volumes are locked until the
    caller's transaction commits the sandbox and its mounts (see :func:`volume_delete`)."""
    if not mounts:
        return []
    if len(mounts) > MAX_MOUNTS_PER_SANDBOX:
        raise BadRequest(f"at most {MAX_MOUNTS_PER_SANDBOX} volume mounts per sandbox")
    names = {name for name, _ in mounts}
    # Locked in primary-key order, so concurrent creates naming the same volumes lock them
    # alike. A volume being deleted is not found.
    found = {
        volume.name: volume
        for volume in Volume.objects.select_for_update()
        .filter(team=team, name__in=names, state=State.READY)
        .order_by("pk")
    }
    invalid: list[tuple[int, str]] = []
    resolved: list[tuple[Volume, str]] = []
    used: set[str] = set()
    for index, (name, path) in enumerate(mounts):
        volume = found.get(name)
        if volume is None:
            invalid.append((index, f"volume '{name}' not found"))
            continue
        problem = mount_path_problem(path)
        if problem:
            invalid.append((index, problem))
            continue
        if path in used:
            invalid.append((index, f"path '{path}' is already used"))
            continue
        # Not E2B's: one mount inside another would hide it, or be hidden, by mount order.
        outer = next(
            (p for p in used if path.startswith(p + "/") or p.startswith(path + "/")), None
        )
        if outer is not None:
            invalid.append((index, f"path '{path}' is nested with '{outer}', another mount's"))
            continue
        used.add(path)
        stored_on = node_named(volume.host, local=node)
        if stored_on != node:
            invalid.append(
                (
                    index,
                    f"volume '{name}' is stored on another host of this service (host "
                    f"{stored_on.label}), not on this one: a sandbox mounts only "
                    "the volumes of its own host",
                )
            )
            continue
        resolved.append((volume, path))
    if invalid:
        lines = "\n".join(f"\t- volume mount #{i}: {reason}" for i, reason in invalid)
        raise BadRequest(f"invalid mounts:\n{lines}")  # E2B's shape
    return resolved
