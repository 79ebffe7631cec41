"""Opaque, tamper-evident keyset paging tokens (``X-Next-Token``).

A token carries the last row's (timestamp, id) and a digest of the filters it was issued
under, signed with SECRET_KEY: a forged, altered or re-used-with-other-filters token is a
400, never a peek at rows the filters exclude.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from django.core import signing
from django.utils.dateparse import parse_datetime

from e2bfacade.errors import BadRequest


def _digest(filters: object) -> str:
    return hashlib.sha256(json.dumps(filters, default=str).encode()).hexdigest()[:16]


def make_token(*, salt: str, at: datetime, pk: str, filters: object) -> str:
    return signing.dumps({"t": at.isoformat(), "i": pk, "f": _digest(filters)}, salt=salt)


def read_token(token: str, *, salt: str, filters: object) -> tuple[datetime, str]:
    try:
        cursor = signing.loads(token, salt=salt)
        at = parse_datetime(cursor["t"])
        pk = cursor["i"]
        valid = cursor["f"] == _digest(filters) and at is not None and isinstance(pk, str)
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        valid = False
    if not valid:
        raise BadRequest("nextToken is invalid or was issued for other filters")
    return at, pk  # type: ignore[return-value]
