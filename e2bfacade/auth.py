"""``X-API-Key`` authentication: the key resolves to exactly one team.

A resolved key is trusted by the process for ``API_KEY_CACHE_SECONDS`` (default 5): a
request then costs no query for its key. So a key revoked in the admin (or the database)
stops working within that time in every process, and at once in the process that revoked
it. Unknown and revoked keys are never remembered: a new key works at once, and a wrong one
is asked about every time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from e2bfacade.models import ApiKey, Team, hash_api_key

CACHE_MAX = 10_000  # keys; beyond, the cache starts over (a bound on memory, not a policy)
_cache: dict[str, tuple[float, ApiKey]] = {}
_cache_lock = threading.Lock()


def forget_api_keys() -> None:
    """Drop this process's trusted keys (after a revocation made here; in tests)."""
    with _cache_lock:
        _cache.clear()


def resolve_api_key(raw: str) -> ApiKey | None:
    ttl = settings.API_KEY_CACHE_SECONDS
    if not ttl:
        return ApiKey.objects.resolve(raw)
    digest = hash_api_key(raw)
    now = time.monotonic()
    hit = _cache.get(digest)
    if hit is not None and hit[0] > now:
        return hit[1]
    key = ApiKey.objects.resolve(raw)
    with _cache_lock:
        if key is None:
            _cache.pop(digest, None)
        else:
            if len(_cache) >= CACHE_MAX:
                _cache.clear()
            _cache[digest] = (now + ttl, key)
    return key


class TeamPrincipal:
    """The authenticated caller: a team, not a Django user."""

    is_authenticated = True

    def __init__(self, team: Team) -> None:
        self.team = team

    def __str__(self) -> str:
        return f"team:{self.team.pk}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[TeamPrincipal, Any] | None:
        raw = request.headers.get("X-API-Key")  # Django matches header names case-insensitively
        if not raw:
            raise exceptions.NotAuthenticated("missing X-API-Key header")
        key = resolve_api_key(raw)
        if key is None:
            raise exceptions.AuthenticationFailed("invalid API key")
        return TeamPrincipal(key.team), key

    def authenticate_header(self, request: Request) -> str:
        return "X-API-Key"
