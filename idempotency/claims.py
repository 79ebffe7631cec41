"""Claim, execute, complete: exactly-once execution of one keyed request.

1. **Claim** (:func:`key_claim`) in one short transaction: insert the record, or lock the
   existing one. The unique constraint on (team, key) arbitrates a race; we never
   check-then-insert. Then, in this order: other fingerprint -> mismatch; completed ->
   replay; past retention -> start afresh; in progress with a live owner -> in progress;
   in progress with a dead owner -> take over (attempt + 1). A new claim reserves the
   resource id and the operation's resource row in the same transaction. The insert is
   tried first, with no savepoint: the caller has just read that there is no record, so a
   lost race is rare, and it costs a second transaction rather than two statements on
   every new key.
2. **Execute** (:func:`claim_execute`) with the reserved id, no transaction held. Operations
   are idempotent by id, so a takeover re-drives the same id and can never allocate twice.
3. **Complete**, fenced on the lease owner: a slow original that lost its lease cannot
   overwrite the taker-over's result. A failure that provably allocated nothing releases
   the key instead; one we cannot classify gives the lease up at once.

Separate from the HTTP edge (``idempotency/http.py``) because the worker drives the same
algorithm with no request at all (``idempotency/maintenance.py``): nothing here reads a
header or builds a response. Who counts as a live owner is ``idempotency/leases.py``'s call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, cast

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Field
from django.utils import timezone

from e2bfacade import crypto, observability
from e2bfacade.errors import ApiError, ServiceUnavailable
from e2bfacade.failpoints import failpoint
from e2bfacade.models import Team
from idempotency.fingerprint import CURRENT_VERSION
from idempotency.leases import (
    ADVISORY_NAMESPACE,
    advisory_lock_key,
    advisory_try_lock,
    advisory_unlock,
    lease_expires_at,
    owner_is_alive,
)
from idempotency.models import IdempotencyRecord
from idempotency.registry import Operation
from idempotency.results import Result, error_result, render, stored_result

logger = logging.getLogger(__name__)

State = IdempotencyRecord.State
# The request's fingerprint under a given fingerprint version.
FingerprintFn = Callable[[str], str]


def operation_run(
    op: Operation,
    team: Team,
    params: dict[str, str],
    body: dict[str, Any],
    rid: str,
    reserved: Any = None,
) -> Result:
    """Execute ``op`` once for the reserved id ``rid`` and render its answer. ``reserved``:
    what this request's own ``op.reserve`` returned (committed), None on a re-drive."""
    status, payload = op.execute(team, params, body, rid, reserved)
    return Result(status, render(payload))


def request_matches(record: IdempotencyRecord, op: Operation, fp_for: FingerprintFn) -> bool:
    """Compare under the record's own fingerprint version; a version this release does not
    know (written by a newer one) cannot be shown equal, so it is a mismatch, not a crash."""
    version = record.fingerprint.split(":", 1)[0]
    try:
        return bool(record.route == op.route and record.fingerprint == fp_for(version))
    except ValueError:
        return False


# ------------------------------------------------------------------------------- claim
class ClaimKind(StrEnum):
    EXECUTE = "execute"
    REPLAY = "replay"
    MISMATCH = "mismatch"
    IN_PROGRESS = "in_progress"
    UNKNOWN = "unknown"
    DONE = "done"


@dataclass
class Claim:
    kind: ClaimKind
    record: IdempotencyRecord | None = None
    result: Result | None = None
    reserved: Any = None  # a new claim's: what op.reserve returned


def _new_record(
    team: Team,
    key: str,
    op: Operation,
    fp: str,
    params: dict[str, str],
    body: dict[str, Any],
    owner: str,
    now: datetime,
) -> IdempotencyRecord:
    """Insert a new in-progress record owned by ``owner``, its advisory lock held: the lock
    is taken before the record is visible to anyone else."""
    record = IdempotencyRecord(
        team=team,
        key=key,
        route=op.route,
        fingerprint=fp,
        state=State.IN_PROGRESS,
        lease_owner=owner,
        lease_expires_at=lease_expires_at(now),
        attempt=1,
        resource_id=op.new_resource_id(),
        request_encrypted=crypto.encrypt(json.dumps({"params": params, "body": body}).encode()),
        created_at=now,
        expires_at=now + timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS),
    )
    _insert_locked(record)
    return record


def _insert_locked(record: IdempotencyRecord) -> None:
    """Insert ``record`` and take its advisory lock. On PostgreSQL that is one statement:
    the INSERT's RETURNING takes the lock on the id the row was given. The id is new, so
    the lock is always free."""
    if connection.vendor != "postgresql":
        record.save(force_insert=True)
        return
    sql, fields = _insert_sql()
    values = [f.get_db_prep_save(getattr(record, f.attname), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, ADVISORY_NAMESPACE])
        record.pk, locked = cursor.fetchone()
    assert locked, "a new record's advisory lock was taken"
    record._state.adding = False
    record._state.db = connection.alias


@functools.cache
def _insert_sql() -> tuple[str, list[Field[Any, Any]]]:
    """PostgreSQL's INSERT of a new record, built once from the model (as the completing
    UPDATE is, ``_complete_sql``), and the fields whose values it takes, in order."""
    meta = IdempotencyRecord._meta
    qn = connection.ops.quote_name
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    pk = qn(cast(str, meta.pk.column))
    return (
        f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(cast(str, f.column)) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))}) "
        f"RETURNING {pk}, pg_try_advisory_lock(%s + {pk})",
        fields,
    )


def key_claim(
    team: Team,
    key: str,
    op: Operation,
    fp_for: FingerprintFn,
    params: dict[str, str],
    body: dict[str, Any],
    owner: str,
) -> Claim:
    """Claim ``key`` for ``owner`` in one short transaction and say what to do next.

    "execute": ``owner`` now holds the lease (and, on PostgreSQL, the advisory lock, which
    :func:`claim_execute` releases). "done": a new claim's reserve refused deterministically
    and that refusal is stored. The others leave the record as it was."""
    now = timezone.now()
    fingerprint_now = fp_for(CURRENT_VERSION)
    made: list[IdempotencyRecord] = []

    def claim_new() -> Claim:
        made.append(_new_record(team, key, op, fingerprint_now, params, body, owner, now))
        return _claim_new(team, op, params, body, made[-1], now)

    try:
        with transaction.atomic():
            return claim_new()
    except IntegrityError:
        # Lost the race for the key (the other unique constraints hold random ids): that
        # transaction is gone, and the record that won is read under its lock below.
        if made or not IdempotencyRecord.objects.filter(team=team, key=key).exists():
            _unlock_rolled_back(made)
            raise
    except BaseException:
        _unlock_rolled_back(made)
        raise
    try:
        with transaction.atomic():
            return _claim_existing(team, key, op, fp_for, owner, now, claim_new)
    except BaseException:
        _unlock_rolled_back(made)
        raise


def _unlock_rolled_back(made: list[IdempotencyRecord]) -> None:
    """A session advisory lock outlives the rollback of the transaction that took it: free
    the lock of a record that rolled back (its id is never used again)."""
    for record in made:
        with contextlib.suppress(DatabaseError):  # a lost connection took its locks along
            advisory_unlock(record.pk)


def _claim_existing(
    team: Team,
    key: str,
    op: Operation,
    fp_for: FingerprintFn,
    owner: str,
    now: datetime,
    claim_new: Callable[[], Claim],
) -> Claim:
    """The key has a record: decide under its row lock (see the module's order)."""
    record = IdempotencyRecord.objects.select_for_update().filter(team=team, key=key).first()
    if record is None:
        # Gone since our insert lost to it (its original released it, or a purge): the
        # caller reads again and claims afresh, as for any request still in progress.
        return Claim(ClaimKind.IN_PROGRESS)
    if record.expires_at <= now:
        # Past retention: the key may create anew. The old resource stays as it is.
        record.delete()
        return claim_new()
    if not request_matches(record, op, fp_for):
        observability.idempotency_event("mismatch")
        return Claim(ClaimKind.MISMATCH, record)
    if record.state == State.COMPLETED:
        observability.idempotency_event("replay")
        return Claim(ClaimKind.REPLAY, record, stored_result(record))
    if owner_is_alive(record, now):
        return Claim(ClaimKind.IN_PROGRESS, record)
    if record.attempt >= settings.IDEMPOTENCY_MAX_ATTEMPTS:
        observability.idempotency_event("unknown_outcome")
        return Claim(ClaimKind.UNKNOWN, record)
    # Take over: the previous owner is gone. Same resource id, next attempt.
    if not advisory_try_lock(record.pk):
        return Claim(ClaimKind.IN_PROGRESS, record)  # someone else got it first
    record.lease_owner = owner
    record.lease_expires_at = lease_expires_at(now)
    record.attempt += 1
    record.save(update_fields=["lease_owner", "lease_expires_at", "attempt"])
    logger.info("idempotency: took over %s attempt %d", record.pk, record.attempt)
    observability.idempotency_event("takeover")
    return Claim(ClaimKind.EXECUTE, record)


def _claim_new(
    team: Team,
    op: Operation,
    params: dict[str, str],
    body: dict[str, Any],
    record: IdempotencyRecord,
    now: datetime,
) -> Claim:
    """A new claim, inside its record's transaction: make the intent durable with the
    record. A deterministic refusal (unknown template, timeout too long) completes the
    record with that error."""
    observability.idempotency_event("executed")
    if op.reserve is None:
        return Claim(ClaimKind.EXECUTE, record)
    try:
        # No savepoint: a reserve raises ApiError only before it writes (registry).
        reserved = op.reserve(team, params, body, record.resource_id)
    except ApiError as exc:
        result = error_result(exc)
        advisory_unlock(record.pk)
        if exc.releases_key:
            # A limit, not an answer: forget the key (this transaction made the record),
            # so the same key may try again once the limit allows.
            record.delete()
            return Claim(ClaimKind.DONE, None, result)
        _store(record, result, now)
        return Claim(ClaimKind.DONE, record, result)
    return Claim(ClaimKind.EXECUTE, record, reserved=reserved)


# ---------------------------------------------------------------------------- complete
def _store(record: IdempotencyRecord, result: Result, now: datetime) -> None:
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
    """Store the outcome if we still own the lease. False: we lost it to a taker-over.

    On PostgreSQL the same statement releases the advisory lock when it completes the
    record: its RETURNING runs before the UPDATE commits, which is safe because whoever
    could take the record over locks its row first (``_claim_existing``, the worker's
    re-drive) and so waits for this commit, then finds the record completed. When the
    UPDATE matches nothing the lock is still held, and ``claim_execute`` frees it."""
    values: dict[str, Any] = {
        "state": State.COMPLETED,
        "response_status": result.status,
        "response_content_type": result.content_type,
        "response_body_encrypted": crypto.encrypt(result.body),
        "completed_at": timezone.now(),
    }
    if connection.vendor != "postgresql":
        return bool(
            IdempotencyRecord.objects.filter(
                pk=record.pk, lease_owner=owner, state=State.IN_PROGRESS
            ).update(**values)
        )
    with connection.cursor() as cursor:
        cursor.execute(
            _complete_sql(tuple(values)),
            [*values.values(), record.pk, owner, State.IN_PROGRESS, advisory_lock_key(record.pk)],
        )
        return cursor.fetchone() is not None


@functools.cache
def _complete_sql(columns: tuple[str, ...]) -> str:
    """PostgreSQL's completing UPDATE, built once from the model: compiled through the ORM
    it cost 0.27 ms more per create."""
    meta = IdempotencyRecord._meta
    qn = connection.ops.quote_name
    column = {f.name: cast(str, f.column) for f in meta.concrete_fields}
    assignments = ", ".join(f"{qn(column[name])} = %s" for name in columns)
    return (
        f"UPDATE {qn(meta.db_table)} SET {assignments} WHERE {qn(column[meta.pk.name])} = %s "
        f"AND {qn('lease_owner')} = %s AND {qn('state')} = %s RETURNING pg_advisory_unlock(%s)"
    )


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


# ----------------------------------------------------------------------------- execute
def claim_execute(
    op: Operation,
    team: Team,
    params: dict[str, str],
    body: dict[str, Any],
    record: IdempotencyRecord,
    owner: str,
    reserved: Any = None,
) -> Result:
    """Run (or re-drive) a claimed request and complete its record. ``owner`` holds the
    claim; its advisory lock is released on the way out, whatever happens. ``reserved``:
    what a new claim's reserve returned (:attr:`Claim.reserved`)."""
    completed = False
    try:
        failpoint("after_claim")
        try:
            result = operation_run(op, team, params, body, record.resource_id, reserved)
        except ApiError as exc:
            if exc.releases_key:
                _release(record, owner)
                return error_result(exc)
            if exc.status >= 500:
                _abandon_lease(record, owner)
                return error_result(exc)
            result = error_result(exc)  # deterministic: stored and replayed, as E2B does
        except DatabaseError:
            # The database went away mid-way (the resource may exist): the record says "in
            # progress" under the reserved id, so a retry with the same key re-drives it to
            # the one resource. Tell the client so (the lease goes with our connection, or
            # expires).
            logger.warning("idempotency: the database failed under %s", record.pk, exc_info=True)
            with contextlib.suppress(DatabaseError):
                _abandon_lease(record, owner)
            return error_result(
                ServiceUnavailable(
                    "the database failed while this request ran; retry with the same "
                    "Idempotency-Key: the retry completes it, exactly once",
                    headers={"Retry-After": "1", "Should-Retry": "true"},
                )
            )
        except Exception:
            _abandon_lease(record, owner)
            raise
        failpoint("before_complete")
        completed = _complete(record, owner, result)
        if not completed:
            # A taker-over owns the record now; it drove the same resource id, so its
            # stored answer (if already there) is the one every caller gets.
            fresh = IdempotencyRecord.objects.filter(pk=record.pk).first()
            if fresh is not None and fresh.state == State.COMPLETED:
                # Not a replay for this caller: its own request produced this resource.
                return dataclasses.replace(stored_result(fresh), replayed=False)
            logger.warning("idempotency: lost the lease of %s before completing", record.pk)
            return result
        failpoint("after_complete")
        return result
    finally:
        if not (completed and connection.vendor == "postgresql"):  # else _complete freed it
            with contextlib.suppress(DatabaseError):  # a dead connection holds no lock
                advisory_unlock(record.pk)
