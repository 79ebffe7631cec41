"""Exactly-once execution of a mutating request keyed by ``Idempotency-Key``.

1. **Validate** the header (400 on a bad or repeated key) and the body (the caller's
   serializer, 400). Nothing is recorded for these.
2. **Claim** in one short transaction: insert the record, or lock the existing one. The
   unique constraint on (team, key) arbitrates a race; we never check-then-insert. Then, in
   this order: other fingerprint -> 409 mismatch; completed -> replay; past retention ->
   start afresh; in progress with a live owner -> wait briefly, then 409 in progress; in
   progress with a dead owner -> take over (attempt + 1). A new claim reserves the resource
   id and the operation's resource row in the same transaction.
3. **Execute** with the reserved id, no transaction held. Operations are idempotent by id,
   so a takeover re-drives the same id and can never allocate twice.
4. **Complete**, fenced on the lease owner: a slow original that lost its lease cannot
   overwrite the taker-over's result.
5. **Replay**: same status, byte-identical body and content type, ``Idempotent-Replayed``.

A live owner is one whose lease has not expired — and on PostgreSQL, whose connection still
holds the record's advisory lock: a killed owner's connection drops, its lock goes with it,
and a retry can take over at once instead of waiting out the lease.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
import uuid
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from e2bfacade import observability
from e2bfacade.errors import ApiError, BadRequest, NothingAllocated, error_body
from e2bfacade.failpoints import failpoint
from e2bfacade.models import Team
from idempotency import crypto
from idempotency.fingerprint import CURRENT_VERSION, fingerprint
from idempotency.models import IdempotencyRecord
from idempotency.registry import Operation, get_operation

logger = logging.getLogger(__name__)

KEY_PATTERN = re.compile(r"[a-z0-9-]{1,255}")
CONTENT_TYPE = "application/json"
REPLAY_HEADER = "Idempotent-Replayed"
State = IdempotencyRecord.State


def parse_key(request: HttpRequest) -> str | None:
    """The request's Idempotency-Key, or None. A repeated header reaches us joined with
    commas (gunicorn and the WSGI spec join repeats), which the pattern refuses."""
    raw = request.headers.get("Idempotency-Key")
    if raw is None:
        return None
    if "," in raw:
        raise BadRequest("Idempotency-Key must be sent once", error_code="invalid_idempotency_key")
    if not KEY_PATTERN.fullmatch(raw):
        raise BadRequest(
            "Idempotency-Key must be 1-255 characters of a-z, 0-9 and '-'",
            error_code="invalid_idempotency_key",
        )
    return raw


@dataclass(frozen=True)
class Result:
    status: int
    body: bytes
    content_type: str = CONTENT_TYPE
    replayed: bool = False
    headers: tuple[tuple[str, str], ...] = ()

    def to_response(self) -> HttpResponse:
        response = HttpResponse(self.body, status=self.status, content_type=self.content_type)
        if self.replayed:
            response[REPLAY_HEADER] = "true"
        for name, value in self.headers:
            response[name] = value
        return response


def render(payload: Any) -> bytes:
    return JSONRenderer().render(payload)


def error_result(exc: ApiError) -> Result:
    return Result(
        exc.status,
        render(error_body(exc.status, exc.message, exc.error_code)),
        headers=tuple(exc.headers.items()),
    )


def _run(
    op: Operation, team: Team, params: dict[str, str], body: dict[str, Any], rid: str
) -> Result:
    status, payload = op.execute(team, params, body, rid)
    return Result(status, render(payload))


# ------------------------------------------------------------------------------ leases
def _lock_key(record_pk: int) -> int:
    return zlib.crc32(f"e2bfacade.idempotency:{record_pk}".encode()) - 2**31


def _advisory(fn: str, record_pk: int) -> bool:
    """pg_try_advisory_lock / pg_advisory_unlock; always True off PostgreSQL, where the
    time-based lease alone decides."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {fn}(%s)", [_lock_key(record_pk)])
        return bool(cursor.fetchone()[0])


def _owner_alive(record: IdempotencyRecord, now: Any) -> bool:
    """Whether the record's owner is still working on it.

    On PostgreSQL the owner's session advisory lock decides: it is held exactly as long as
    the owner's process (and so its connection) lives, so a dead owner is taken over at once
    and a slow but live one is never raced. Elsewhere (SQLite) the time-based lease decides.
    Safe without the row lock: a claim takes the advisory lock before its record is visible.
    """
    if connection.vendor != "postgresql":
        return bool(record.lease_expires_at > now)
    if _advisory("pg_try_advisory_lock", record.pk):
        _advisory("pg_advisory_unlock", record.pk)
        return False
    return True


def _same_request(record: IdempotencyRecord, op: Operation, fp_for: Any) -> bool:
    """Compare under the record's own fingerprint version; a version this release does not
    know (written by a newer one) cannot be shown equal, so it is a mismatch, not a crash."""
    version = record.fingerprint.split(":", 1)[0]
    try:
        return bool(record.route == op.route and record.fingerprint == fp_for(version))
    except ValueError:
        return False


# ------------------------------------------------------------------------------- claim
@dataclass
class Claim:
    kind: str  # "execute" | "replay" | "mismatch" | "in_progress" | "unknown" | "done"
    record: IdempotencyRecord | None = None
    result: Result | None = None


def _new_record(
    team: Team,
    key: str,
    op: Operation,
    fp: str,
    params: dict[str, str],
    body: dict[str, Any],
    owner: str,
    now: Any,
) -> IdempotencyRecord:
    return IdempotencyRecord.objects.create(
        team=team,
        key=key,
        route=op.route,
        fingerprint=fp,
        state=State.IN_PROGRESS,
        lease_owner=owner,
        lease_expires_at=now + timedelta(seconds=settings.IDEMPOTENCY_LEASE_SECONDS),
        attempt=1,
        resource_id=op.new_resource_id(),
        request_encrypted=crypto.encrypt(json.dumps({"params": params, "body": body}).encode()),
        created_at=now,
        expires_at=now + timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS),
    )


def _claim(
    team: Team,
    key: str,
    op: Operation,
    fp_for: Any,
    params: dict[str, str],
    body: dict[str, Any],
    owner: str,
) -> Claim:
    now = timezone.now()
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint: a lost insert race leaves the tx usable
                record = _new_record(
                    team, key, op, fp_for(CURRENT_VERSION), params, body, owner, now
                )
        except IntegrityError:
            record = IdempotencyRecord.objects.select_for_update().get(team=team, key=key)
            if record.expires_at <= now:
                # Past retention: the key may create anew. The old resource stays as it is.
                record.delete()
                record = _new_record(
                    team, key, op, fp_for(CURRENT_VERSION), params, body, owner, now
                )
            else:
                if not _same_request(record, op, fp_for):
                    observability.idempotency_event("mismatch")
                    return Claim("mismatch", record)
                if record.state == State.COMPLETED:
                    observability.idempotency_event("replay")
                    return Claim("replay", record, _stored(record))
                if _owner_alive(record, now):
                    return Claim("in_progress", record)
                if record.attempt >= settings.IDEMPOTENCY_MAX_ATTEMPTS:
                    observability.idempotency_event("unknown_outcome")
                    return Claim("unknown", record)
                # Take over: the previous owner is gone. Same resource id, next attempt.
                if not _advisory("pg_try_advisory_lock", record.pk):
                    return Claim("in_progress", record)  # someone else got it first
                record.lease_owner = owner
                record.lease_expires_at = now + timedelta(
                    seconds=settings.IDEMPOTENCY_LEASE_SECONDS
                )
                record.attempt += 1
                record.save(update_fields=["lease_owner", "lease_expires_at", "attempt"])
                logger.info("idempotency: took over %s attempt %d", record.pk, record.attempt)
                observability.idempotency_event("takeover")
                return Claim("execute", record)
        # A new claim: make the intent durable with the record. A deterministic refusal
        # (unknown template, timeout too long) completes the record with that error.
        observability.idempotency_event("executed")
        _advisory("pg_try_advisory_lock", record.pk)
        if op.reserve is not None:
            try:
                # No savepoint: a reserve raises ApiError only before it writes (registry).
                op.reserve(team, params, body, record.resource_id)
            except ApiError as exc:
                result = error_result(exc)
                _store(record, result, now)
                _advisory("pg_advisory_unlock", record.pk)
                return Claim("done", record, result)
        return Claim("execute", record)


def _stored(record: IdempotencyRecord) -> Result:
    assert record.response_status is not None and record.response_body_encrypted is not None
    return Result(
        record.response_status,
        crypto.decrypt(record.response_body_encrypted),
        record.response_content_type,
        replayed=True,
    )


def _store(record: IdempotencyRecord, result: Result, now: Any) -> None:
    record.state = State.COMPLETED
    record.response_status = result.status
    record.response_content_type = result.content_type
    record.response_body_encrypted = crypto.encrypt(result.body)
    record.completed_at = now
    record.save(
        update_fields=[
            "state",
            "response_status",
            "response_content_type",
            "response_body_encrypted",
            "completed_at",
        ]
    )


def _complete(record: IdempotencyRecord, owner: str, result: Result) -> bool:
    """Store the outcome if we still own the lease. False: we lost it to a taker-over."""
    updated = IdempotencyRecord.objects.filter(
        pk=record.pk, lease_owner=owner, state=State.IN_PROGRESS
    ).update(
        state=State.COMPLETED,
        response_status=result.status,
        response_content_type=result.content_type,
        response_body_encrypted=crypto.encrypt(result.body),
        completed_at=timezone.now(),
    )
    return bool(updated)


def _release(record: IdempotencyRecord, owner: str) -> None:
    """Forget the key: nothing was allocated, so the same key may simply try again."""
    observability.idempotency_event("release")
    IdempotencyRecord.objects.filter(
        pk=record.pk, lease_owner=owner, state=State.IN_PROGRESS
    ).delete()


def _abandon_lease(record: IdempotencyRecord, owner: str) -> None:
    """The attempt failed in a way we cannot classify: let the next retry take over at once."""
    IdempotencyRecord.objects.filter(
        pk=record.pk, lease_owner=owner, state=State.IN_PROGRESS
    ).update(lease_expires_at=timezone.now())


# -------------------------------------------------------------------------------- drive
def _execute_claim(
    op: Operation,
    team: Team,
    params: dict[str, str],
    body: dict[str, Any],
    record: IdempotencyRecord,
    owner: str,
) -> Result:
    """Run (or re-drive) a claimed request and complete its record."""
    try:
        failpoint("after_claim")
        try:
            result = _run(op, team, params, body, record.resource_id)
        except NothingAllocated as exc:
            _release(record, owner)
            return error_result(exc)
        except ApiError as exc:
            if exc.status >= 500:
                _abandon_lease(record, owner)
                return error_result(exc)
            result = error_result(exc)  # deterministic: stored and replayed, as E2B does
        except Exception:
            _abandon_lease(record, owner)
            raise
        failpoint("before_complete")
        if not _complete(record, owner, result):
            # A taker-over owns the record now; it drove the same resource id, so its
            # stored answer (if already there) is the one every caller gets.
            fresh = IdempotencyRecord.objects.filter(pk=record.pk).first()
            if fresh is not None and fresh.state == State.COMPLETED:
                # Not a replay for this caller: its own request produced this resource.
                return dataclasses.replace(_stored(fresh), replayed=False)
            logger.warning("idempotency: lost the lease of %s before completing", record.pk)
            return result
        failpoint("after_complete")
        return result
    finally:
        _advisory("pg_advisory_unlock", record.pk)


def _mismatch_response() -> HttpResponse:
    return error_result(
        ApiError(
            "this Idempotency-Key was used for a different request",
            status=409,
            error_code="idempotency_request_mismatch",
        )
    ).to_response()


def _in_progress_error() -> ApiError:
    return ApiError(
        "a request with this Idempotency-Key is still in progress; retry shortly",
        status=409,
        error_code="idempotency_in_progress",
        headers={"Retry-After": "1", "Should-Retry": "true"},
    )


def run(
    request: HttpRequest,
    *,
    team: Team,
    route: str,
    params: dict[str, str],
    body: dict[str, Any],
) -> HttpResponse:
    """Execute the registered operation ``route`` for this request, exactly once per key.

    ``body`` is the canonical body (validated, defaults applied, nulls dropped): it is both
    fingerprinted and kept to re-drive the request. Without a key the operation simply runs.
    """
    op = get_operation(route)
    key = parse_key(request)
    if key is None:
        rid = op.new_resource_id()
        try:
            if op.reserve is not None:
                with transaction.atomic():
                    op.reserve(team, params, body, rid)
            return _run(op, team, params, body, rid).to_response()
        except ApiError as exc:
            return error_result(exc).to_response()

    def fp_for(version: str) -> str:
        return fingerprint(
            version,
            method=request.method or "",
            path=request.path,
            query=request.GET.lists(),
            body=body,
        )

    owner = uuid.uuid4().hex
    deadline = time.monotonic() + settings.IDEMPOTENCY_WAIT_SECONDS
    while True:
        # The common repeat (a replay, or a wait for a live original) is answered from a
        # plain read: no transaction, no insert attempt. _claim stays the arbiter of the
        # rest (no record yet, an expired one, a dead owner).
        seen = IdempotencyRecord.objects.filter(team=team, key=key).first()
        if seen is not None and seen.expires_at > timezone.now():
            if not _same_request(seen, op, fp_for):
                observability.idempotency_event("mismatch")
                return _mismatch_response()
            if seen.state == State.COMPLETED:
                observability.idempotency_event("replay")
                return _stored(seen).to_response()
            if _owner_alive(seen, timezone.now()):
                if time.monotonic() >= deadline:
                    observability.idempotency_event("in_progress")
                    return error_result(_in_progress_error()).to_response()
                time.sleep(0.02)
                continue
        claim = _claim(team, key, op, fp_for, params, body, owner)
        if claim.kind == "execute":
            assert claim.record is not None
            return _execute_claim(op, team, params, body, claim.record, owner).to_response()
        if claim.kind in ("replay", "done"):
            assert claim.result is not None
            return claim.result.to_response()
        if claim.kind == "mismatch":
            return _mismatch_response()
        if claim.kind == "unknown":
            assert claim.record is not None
            return error_result(
                ApiError(
                    f"the outcome of the original request is unknown after {claim.record.attempt} "
                    f"attempts (reserved resource {claim.record.resource_id})",
                    status=422,
                    error_code="idempotency_outcome_unknown",
                )
            ).to_response()
        # In progress: the original is alive. Wait a little for it rather than bouncing
        # the caller (E2B answers at once); no lock or transaction is held while we wait.
        if time.monotonic() >= deadline:
            observability.idempotency_event("in_progress")
            return error_result(_in_progress_error()).to_response()
        time.sleep(0.02)


def drive_abandoned(*, limit: int = 100) -> list[int]:
    """The worker's part: take over claims whose owner died and drive them to completion,
    so a client that never retries leaves no stuck record (and no sandbox in ``creating``).
    """
    done = []
    now = timezone.now()
    for record in IdempotencyRecord.objects.abandoned(now).select_related("team")[:limit]:
        owner = "worker-" + uuid.uuid4().hex
        with transaction.atomic():
            locked = (
                IdempotencyRecord.objects.select_for_update(skip_locked=True)
                .filter(pk=record.pk)
                .first()
            )
            if (
                locked is None
                or locked.state != State.IN_PROGRESS
                or _owner_alive(locked, timezone.now())
            ):
                continue
            if locked.attempt >= settings.IDEMPOTENCY_MAX_ATTEMPTS:
                continue  # left for its client's retry to answer 422
            if not _advisory("pg_try_advisory_lock", locked.pk):
                continue
            locked.lease_owner = owner
            locked.lease_expires_at = timezone.now() + timedelta(
                seconds=settings.IDEMPOTENCY_LEASE_SECONDS
            )
            locked.attempt += 1
            locked.save(update_fields=["lease_owner", "lease_expires_at", "attempt"])
            observability.idempotency_event("takeover")
        saved = json.loads(crypto.decrypt(locked.request_encrypted))
        try:
            _execute_claim(
                get_operation(locked.route),
                record.team,
                saved["params"],
                saved["body"],
                locked,
                owner,
            )
        except Exception:
            logger.exception("idempotency: re-driving record %s failed", locked.pk)
            continue
        done.append(locked.pk)
    return done


def purge_expired(*, batch_size: int = 10_000, dry_run: bool = False) -> int:
    """Delete records past retention in batches; returns how many. Never a live claim (see
    ``purgeable``). Safe beside traffic and beside another purge: each batch locks its rows
    with SKIP LOCKED, so two purges split the work and a row a claim holds is skipped."""
    if dry_run:
        return IdempotencyRecord.objects.purgeable(timezone.now()).count()
    total = 0
    while True:
        now = timezone.now()
        with transaction.atomic():
            pks = list(
                IdempotencyRecord.objects.purgeable(now)
                .select_for_update(skip_locked=True)
                .order_by("pk")
                .values_list("pk", flat=True)[:batch_size]
            )
            if not pks:
                return total
            # Nothing references a record, so this is one DELETE; the condition is
            # re-checked in it, so a row renewed since we read it stays.
            deleted, _ = IdempotencyRecord.objects.purgeable(now).filter(pk__in=pks).delete()
            total += deleted
            observability.idempotency_purged(deleted)
