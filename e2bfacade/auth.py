"""``X-API-Key`` authentication: the key resolves to exactly one team."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from e2bfacade.models import ApiKey, Team


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
        key = ApiKey.objects.resolve(raw)
        if key is None:
            raise exceptions.AuthenticationFailed("invalid API key")
        return TeamPrincipal(key.team), key

    def authenticate_header(self, request: Request) -> str:
        return "X-API-Key"
