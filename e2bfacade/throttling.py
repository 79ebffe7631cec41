"""Per-team rate limiting: ``API_RATE_LIMIT`` requests per ``API_RATE_WINDOW_SECONDS``.

A fixed-window counter in the database, bumped with one ``INSERT ... ON CONFLICT DO UPDATE
... RETURNING`` per request: exact across every gunicorn worker and replica (no process-local
state), one round trip, on PostgreSQL and SQLite alike. Over the limit: 429 with
``Retry-After`` (seconds to the next window), which the E2B SDKs honour.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import connection
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from e2bfacade.auth import TeamPrincipal
from e2bfacade.models import RateLimitWindow

_BUMP = f"""
INSERT INTO {RateLimitWindow._meta.db_table} (team_id, window_start, count) VALUES (%s, %s, 1)
ON CONFLICT (team_id, window_start) DO UPDATE SET count = {RateLimitWindow._meta.db_table}.count + 1
RETURNING count
"""


class TeamRateThrottle(BaseThrottle):
    _wait: float = 0.0

    def allow_request(self, request: Request, view: Any) -> bool:
        limit = settings.API_RATE_LIMIT
        principal = request.user
        if not limit or not isinstance(principal, TeamPrincipal):
            return True
        window = settings.API_RATE_WINDOW_SECONDS
        now = time.time()
        start = int(now // window * window)
        with connection.cursor() as cursor:
            cursor.execute(_BUMP, [principal.team.pk, start])
            (count,) = cursor.fetchone()
        self._wait = start + window - now
        return bool(count <= limit)

    def wait(self) -> float:
        return self._wait


def purge_windows(*, older_than_seconds: int = 3600) -> int:
    cutoff = int(time.time()) - older_than_seconds
    deleted, _ = RateLimitWindow.objects.filter(window_start__lt=cutoff).delete()
    return deleted
