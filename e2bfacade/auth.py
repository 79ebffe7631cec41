"""Authentication. ``X-API-Key`` (every sandbox and template route): the key resolves to
exactly one team. The routes that manage keys and tokens take instead an access token
(``Authorization: Bearer sk_e2b_…``) or the operator's admin token (``X-Admin-Token``,
``E2BFACADE_ADMIN_TOKEN``), never an API key: a leaked key cannot mint more.

A resolved key is trusted by the process for ``API_KEY_CACHE_SECONDS`` (default 5): a
request then costs no query for its key. So a key revoked in the admin (or the database)
stops working within that time in every process, and at once in the process that revoked
it. Unknown and revoked keys are never remembered: a new key works at once, and a wrong one
is asked about every time.
"""

from __future__ import annotations

import hmac
import threading
import time
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from e2bfacade.errors import NotFound
from e2bfacade.models import LAST_USED_RESOLUTION, AccessToken, ApiKey, Team, hash_api_key

CACHE_MAX = 10_000  # keys; beyond, the cache starts over (a bound on memory, not a policy)
_cache: dict[str, tuple[float, ApiKey]] = {}
_cache_lock = threading.Lock()


def forget_api_keys() -> None:
    """Drop this process's trusted keys (after a revocation made here; in tests)."""
    with _cache_lock:
        _cache.clear()


def _resolve_and_note_use(raw: str) -> ApiKey | None:
    """The live key, its ``last_used_at`` moved to now when it is older than
    LAST_USED_RESOLUTION: a write at most once a minute per key, not one per request. (A key
    trusted from the cache is not asked about, so ``lastUsed`` lags by at most that too.)"""
    key = ApiKey.objects.resolve(raw)
    if key is None:
        return None
    now = timezone.now()
    if key.last_used_at is None or key.last_used_at < now - LAST_USED_RESOLUTION:
        # Guarded, so concurrent requests of one key write it once.
        ApiKey.objects.filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION),
            pk=key.pk,
        ).update(last_used_at=now)
        key.last_used_at = now
    return key


def resolve_api_key(raw: str) -> ApiKey | None:
    ttl = settings.API_KEY_CACHE_SECONDS
    if not ttl:
        return _resolve_and_note_use(raw)
    digest = hash_api_key(raw)
    now = time.monotonic()
    hit = _cache.get(digest)
    if hit is not None and hit[0] > now:
        return hit[1]
    key = _resolve_and_note_use(raw)
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


# ------------------------------------------------------------------ keys and tokens
class AccessTokenPrincipal(TeamPrincipal):
    """A caller with an access token: its team, and the token (the history names it)."""

    def __init__(self, team: Team, token: AccessToken) -> None:
        super().__init__(team)
        self.token = token

    def __str__(self) -> str:
        return f"access token {self.token}"


class AdminPrincipal(TeamPrincipal):
    """The operator's admin token, acting on one team (``X-Team-ID`` or the path's)."""

    def __str__(self) -> str:
        return "the admin token"


class OperatorPrincipal:
    """The operator's admin token on a route that names no team (running counts). Not a
    TeamPrincipal: no team's rate limit counts it and no team route accepts it."""

    is_authenticated = True

    def __str__(self) -> str:
        return "the admin token"


def _team_header(request: Request) -> str | None:
    return request.headers.get("X-Team-ID") or None


class AccessTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <access token>``. ``X-Team-ID`` may come with it (E2B's
    clients send it); it must then name the token's team. Without a Bearer header this
    authenticator abstains, so the admin token may be tried next."""

    def authenticate(self, request: Request) -> tuple[TeamPrincipal, Any] | None:
        header = request.headers.get("Authorization", "")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        token = AccessToken.objects.resolve(raw.strip())
        if token is None:
            raise exceptions.AuthenticationFailed("invalid access token")
        team_id = _team_header(request)
        if team_id is not None and team_id != str(token.team_id):
            raise exceptions.AuthenticationFailed("X-Team-ID does not name this token's team")
        return AccessTokenPrincipal(token.team, token), token

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class AdminTokenAuthentication(authentication.BaseAuthentication):
    """``X-Admin-Token``, compared in constant time with ``E2BFACADE_ADMIN_TOKEN`` (unset:
    every admin token is refused). The team is the path's ``teamID`` on E2B's
    ``/admin/teams/{teamID}/…`` routes, else ``X-Team-ID``; a view with ``admin_team =
    False`` (running counts) takes none. An unknown team is a 404: the operator may know
    which teams exist."""

    def authenticate(
        self, request: Request
    ) -> tuple[TeamPrincipal | OperatorPrincipal, Any] | None:
        raw = request.headers.get("X-Admin-Token")
        if raw is None:
            return None
        configured = settings.E2BFACADE_ADMIN_TOKEN
        if not configured:
            raise exceptions.AuthenticationFailed(
                "the admin token is not configured on this server (E2BFACADE_ADMIN_TOKEN)"
            )
        if not hmac.compare_digest(raw.encode("utf-8", "surrogatepass"), configured.encode()):
            raise exceptions.AuthenticationFailed("invalid admin token")
        context = request.parser_context or {}
        view = context.get("view")
        if not getattr(view, "admin_team", True):
            return OperatorPrincipal(), None
        team_id = context.get("kwargs", {}).get("team_id") or _team_header(request)
        if team_id is None:
            raise exceptions.AuthenticationFailed("X-Team-ID header is required with X-Admin-Token")
        team = Team.objects.by_wire_id(team_id)
        if team is None:
            raise NotFound(f"team '{team_id}' not found")
        return AdminPrincipal(team), None

    def authenticate_header(self, request: Request) -> str:
        return "X-Admin-Token"


class NoApiKeyHere(authentication.BaseAuthentication):
    """Last in the list of the key and token routes: when neither an access token nor the
    admin token came, say which credentials the route takes (an API key never)."""

    def authenticate(self, request: Request) -> None:
        if request.headers.get("X-API-Key"):
            raise exceptions.NotAuthenticated(
                "an API key cannot manage keys or tokens: send an access token "
                "(Authorization: Bearer) or the admin token (X-Admin-Token)"
            )
        raise exceptions.NotAuthenticated(
            "missing credentials: send an access token (Authorization: Bearer) "
            "or the admin token (X-Admin-Token)"
        )
