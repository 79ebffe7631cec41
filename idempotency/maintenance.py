"""Maintenance: what the lifecycle worker and ``purge_idempotency_keys`` do to records
nobody is asking about.

- :func:`drive_abandoned` takes over claims whose owner died and drives them to completion,
  so a client that never retries leaves no stuck record (and no sandbox in ``creating``);
- :func:`purge_expired` deletes records past retention, in batches, beside live traffic.

Separate from the request path (``idempotency/http.py``) because these run with no request
and no client: they are batch jobs over many records, each safe beside another copy of
itself (``SKIP LOCKED``), and they reuse the claim algorithm (``idempotency/claims.py``)
rather than repeat it.
"""

from __future__ import annotations

import json
import logging
import uuid

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from e2bfacade import crypto, observability
from idempotency.claims import claim_execute
from idempotency.leases import advisory_try_lock, lease_expires_at, owner_is_alive
from idempotency.models import IdempotencyRecord
from idempotency.registry import get_operation

logger = logging.getLogger(__name__)

State = IdempotencyRecord.State


def drive_abandoned(*, limit: int = 100) -> list[int]:
    """The worker's part: take over claims whose owner died and drive them to completion,
    so a client that never retries leaves no stuck record (and no sandbox in ``creating``).
    Returns the pks of the records it drove.
    """
    done = []
    now = timezone.now()
    for record in IdempotencyRecord.objects.abandoned(now).select_related("team")[:limit]:
        op = get_operation(record.route)
        if op.here is not None:
            saved = json.loads(crypto.decrypt(record.request_encrypted))
            if not op.here(saved["params"], record.resource_id):
                continue  # another host's: its own worker drives it
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
                or owner_is_alive(locked, timezone.now())
            ):
                continue
            if locked.attempt >= settings.IDEMPOTENCY_MAX_ATTEMPTS:
                continue  # left for its client's retry to answer 422
            if not advisory_try_lock(locked.pk):
                continue
            locked.lease_owner = owner
            locked.lease_expires_at = lease_expires_at(timezone.now())
            locked.attempt += 1
            locked.save(update_fields=["lease_owner", "lease_expires_at", "attempt"])
            observability.idempotency_event("takeover")
        saved = json.loads(crypto.decrypt(locked.request_encrypted))
        try:
            claim_execute(
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
