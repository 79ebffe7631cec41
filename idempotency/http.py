"""The HTTP edge of idempotency: what a view calls, and what it reads from the request.

:func:`run` is the one entry point of a keyed route (views call it after validating their
body): it parses and checks the ``Idempotency-Key`` header (400 on a bad or repeated key;
nothing is recorded), fingerprints the request, answers the common repeats (a replay, a
wait for a live original) from a plain read, and otherwise hands over to the claim
algorithm in ``idempotency/claims.py``; it turns every outcome into an HTTP response,
including the 409s (mismatch, in progress) and the 422 (outcome unknown).

Separate from the algorithm because this is the only part that knows there is an HTTP
request: the worker re-drives claims through ``idempotency/maintenance.py`` without one.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from e2bfacade import observability
from e2bfacade.errors import ApiError, BadRequest, ServiceUnavailable
from e2bfacade.models import Team
from idempotency.claims import (
    ClaimKind,
    claim_execute,
    key_claim,
    operation_run,
    request_matches,
)
from idempotency.fingerprint import fingerprint
from idempotency.leases import owner_is_alive
from idempotency.models import IdempotencyRecord
from idempotency.registry import Body, Operation, Params, get_operation
from idempotency.results import error_result, stored_result

logger = logging.getLogger(__name__)
KEY_PATTERN = re.compile(r"[a-z0-9-]{1,255}")
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


def _elsewhere_error() -> ApiError:
    return ServiceUnavailable(
        "the request with this Idempotency-Key is being carried out by another host sharing "
        "this database: send the retry to that host",
        error_code="idempotency_on_another_host",
        headers={"Should-Retry": "false"},
    )


def _run_unkeyed(op: Operation, team: Team, params: Params, body: Body) -> HttpResponse:
    """A request without a key: the operation simply runs. If the database goes away after
    it began, its outcome is unknown to this request and nothing will re-drive it: what it
    made is released if it can be (``Operation.undo``), and the answer never invites a blind
    retry (which could make a second resource)."""
    rid = op.new_resource_id()
    began = False
    try:
        reserved = None
        if op.reserve is not None:
            with transaction.atomic():
                reserved = op.reserve(team, params, body, rid)
        began = True
        return operation_run(op, team, params, body, rid, reserved).to_response()
    except ApiError as exc:
        return error_result(exc).to_response()
    except DatabaseError:
        if not began:
            raise  # nothing was made: the error handler's 500 (or the SDK's retry) is right
        logger.warning("the database failed under %s %s", op.route, rid, exc_info=True)
        undone = op.undo is not None and op.undo(rid)
        outcome = (
            f"{rid} was made and removed again"
            if undone
            else f"{rid} may have been made; list yours before trying again"
        )
        return error_result(
            ServiceUnavailable(
                f"the database failed while this request ran: {outcome}. Send an "
                "Idempotency-Key to have a retry complete a request exactly once",
                error_code="outcome_unknown",
                headers={"Should-Retry": "false"},
            )
        ).to_response()


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
        return _run_unkeyed(op, team, params, body)

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
        # plain read: no transaction, no insert attempt. key_claim stays the arbiter of the
        # rest (no record yet, an expired one, a dead owner).
        seen = IdempotencyRecord.objects.find(team.pk, key)
        if seen is not None and seen.expires_at > timezone.now():
            if not request_matches(seen, op, fp_for):
                observability.idempotency_event("mismatch")
                return _mismatch_response()
            if seen.state == State.COMPLETED:
                observability.idempotency_event("replay")
                return stored_result(seen).to_response()
            # Any host sharing the database waits for a live original and replays its
            # answer (the record and its owner's lease are the database's); only re-driving
            # one whose owner died is the resource's own host's to do.
            if owner_is_alive(seen, timezone.now()):
                if time.monotonic() >= deadline:
                    observability.idempotency_event("in_progress")
                    return error_result(_in_progress_error()).to_response()
                time.sleep(0.02)
                continue
            # The owner let go since the read: it finished (its answer is in the record now)
            # or it died (a re-drive, which is the resource's own host's to do).
            done = IdempotencyRecord.objects.find(team.pk, key)
            if done is not None and done.state == State.COMPLETED and done.pk == seen.pk:
                observability.idempotency_event("replay")
                return stored_result(done).to_response()
            if op.here is not None and not op.here(params, seen.resource_id):
                return error_result(_elsewhere_error()).to_response()
        claim = key_claim(team, key, op, fp_for, params, body, owner)
        if claim.kind is ClaimKind.EXECUTE:
            assert claim.record is not None
            return claim_execute(
                op, team, params, body, claim.record, owner, claim.reserved
            ).to_response()
        if claim.kind in (ClaimKind.REPLAY, ClaimKind.DONE):
            assert claim.result is not None
            return claim.result.to_response()
        if claim.kind is ClaimKind.MISMATCH:
            return _mismatch_response()
        if claim.kind is ClaimKind.UNKNOWN:
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
