"""Leases: who owns an in-progress record, and whether that owner is still alive.

A claim's owner holds a time-based lease (``lease_owner`` + ``lease_expires_at``) and, on
PostgreSQL, a session advisory lock on the record. The lock is held exactly as long as the
owner's connection lives, so a killed owner's lock goes with its connection and a retry can
take over at once instead of waiting out the lease; the time-based lease stays the fallback
and is all SQLite has.

Separate from the claim algorithm (``idempotency/claims.py``) because this is the one
database-vendor-specific part: everything here is a question to PostgreSQL's lock table or
a clock comparison, and nothing here writes a record.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection

from idempotency.models import IdempotencyRecord


def lease_expires_at(now: datetime) -> datetime:
    """When a lease taken or renewed at ``now`` runs out."""
    return now + timedelta(seconds=settings.IDEMPOTENCY_LEASE_SECONDS)


# The high 32 bits of every record's advisory lock key ("e2bf"): a namespace, so the keys
# cannot collide with another user of advisory locks on the same database, and a key SQL
# can compute from the id, so a claim's INSERT takes the lock in the same statement.
ADVISORY_NAMESPACE = 0x65326266 << 32


def advisory_lock_key(record_pk: int) -> int:
    """The 64-bit advisory lock key of a record (:data:`ADVISORY_NAMESPACE` + its id)."""
    return ADVISORY_NAMESPACE + record_pk


def _advisory(fn: str, record_pk: int) -> bool:
    """pg_try_advisory_lock / pg_advisory_unlock; always True off PostgreSQL, where the
    time-based lease alone decides."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {fn}(%s)", [advisory_lock_key(record_pk)])
        return bool(cursor.fetchone()[0])


def advisory_try_lock(record_pk: int) -> bool:
    """Take the record's advisory lock for this connection without waiting. False: another
    live session holds it. Always True off PostgreSQL."""
    return _advisory("pg_try_advisory_lock", record_pk)


def advisory_unlock(record_pk: int) -> bool:
    """Release this connection's advisory lock on the record (True off PostgreSQL)."""
    return _advisory("pg_advisory_unlock", record_pk)


def owner_is_alive(record: IdempotencyRecord, now: Any) -> bool:
    """Whether the record's owner is still working on it.

    On PostgreSQL the owner's session advisory lock decides: it is held exactly as long as
    the owner's process (and so its connection) lives, so a dead owner is taken over at once
    and a slow but live one is never raced. Elsewhere (SQLite) the time-based lease decides.
    Safe without the row lock: a claim takes the advisory lock before its record is visible.
    """
    if connection.vendor != "postgresql":
        return bool(record.lease_expires_at > now)
    if advisory_try_lock(record.pk):
        advisory_unlock(record.pk)
        return False
    return True
