"""E2B's routes for a team's keys and tokens, and the operator's ``/admin/teams/{teamID}/
api-keys``. None of them takes an API key (see e2bfacade.auth): an access token
(``Authorization: Bearer``), or the admin token (``X-Admin-Token``) where E2B allows it."""

from __future__ import annotations

from collections.abc import Sequence

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from e2bfacade.auth import AccessTokenAuthentication, AdminTokenAuthentication, NoApiKeyHere
from e2bfacade.keys import serializers as wire
from e2bfacade.keys import services
from e2bfacade.requests import json_body, team_of
from e2bfacade.schema import errors

TOKEN = (AccessTokenAuthentication, NoApiKeyHere)
TOKEN_OR_ADMIN = (AccessTokenAuthentication, AdminTokenAuthentication, NoApiKeyHere)
ADMIN = (AdminTokenAuthentication, NoApiKeyHere)


class _KeyRoutes(APIView):
    """Credentials per method, as E2B's spec gives them (``methods_token_only``: an access
    token; the others also the admin token with ``X-Team-ID``)."""

    methods_token_only: Sequence[str] = ()
    admin_only = False

    def get_authenticators(self) -> list[BaseAuthentication]:
        method = getattr(self.request, "method", None)  # None while the schema is made
        if self.admin_only:
            classes: Sequence[type[BaseAuthentication]] = ADMIN
        elif method in self.methods_token_only:
            classes = TOKEN
        else:
            classes = TOKEN_OR_ADMIN
        return [cls() for cls in classes]


class TeamsView(_KeyRoutes):
    methods_token_only = ("GET",)

    @extend_schema(
        operation_id="listTeams", responses={200: wire.TeamSerializer(many=True), **errors()}
    )
    def get(self, request: Request) -> Response:
        """The access token's team (E2B lists a user's teams; a token here has one)."""
        return Response([wire.team_wire(team_of(request))])


class ApiKeysView(_KeyRoutes):
    methods_token_only = ("POST",)

    @extend_schema(
        operation_id="listTeamAPIKeys", responses={200: wire.TeamAPIKey(many=True), **errors()}
    )
    def get(self, request: Request) -> Response:
        keys = services.api_key_list(team=team_of(request))
        return Response([wire.api_key_wire(k) for k in keys])

    @extend_schema(
        operation_id="createTeamAPIKey",
        request=wire.NewTeamAPIKey,
        responses={201: wire.CreatedTeamAPIKey, **errors(400)},
    )
    def post(self, request: Request) -> Response:
        key, raw = services.api_key_make(
            team=team_of(request), name=json_body(request).get("name"), actor=request.user
        )
        return Response(wire.created_api_key_wire(key, raw), status=status.HTTP_201_CREATED)


class ApiKeyView(_KeyRoutes):
    @extend_schema(
        operation_id="updateTeamAPIKey",
        request=wire.UpdateTeamAPIKey,
        responses={200: None, **errors(400, 404)},
    )
    def patch(self, request: Request, api_key_id: str) -> Response:
        services.api_key_rename(
            team=team_of(request),
            key_id=api_key_id,
            name=json_body(request).get("name"),
            actor=request.user,
        )
        return Response(status=status.HTTP_200_OK)

    @extend_schema(operation_id="deleteTeamAPIKey", responses={204: None, **errors(400, 404)})
    def delete(self, request: Request, api_key_id: str) -> Response:
        services.api_key_delete(team=team_of(request), key_id=api_key_id, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AccessTokensView(_KeyRoutes):
    methods_token_only = ("POST",)

    @extend_schema(
        operation_id="createAccessToken",
        request=wire.NewAccessToken,
        responses={201: wire.CreatedAccessToken, **errors(400)},
    )
    def post(self, request: Request) -> Response:
        token, raw = services.access_token_make(
            team=team_of(request), name=json_body(request).get("name"), actor=request.user
        )
        return Response(wire.created_access_token_wire(token, raw), status=status.HTTP_201_CREATED)


class AccessTokenView(_KeyRoutes):
    methods_token_only = ("DELETE",)

    @extend_schema(operation_id="deleteAccessToken", responses={204: None, **errors(400, 404)})
    def delete(self, request: Request, access_token_id: str) -> Response:
        services.access_token_delete(
            team=team_of(request), token_id=access_token_id, actor=request.user
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class AdminApiKeysView(_KeyRoutes):
    """``POST /admin/teams/{teamID}/api-keys``: the operator mints a key for a team."""

    admin_only = True

    @extend_schema(
        operation_id="adminCreateTeamAPIKey",
        request=wire.NewTeamAPIKey,
        responses={201: wire.CreatedTeamAPIKey, **errors(400, 404)},
    )
    def post(self, request: Request, team_id: str) -> Response:
        key, raw = services.api_key_make(
            team=team_of(request), name=json_body(request).get("name"), actor=request.user
        )
        return Response(wire.created_api_key_wire(key, raw), status=status.HTTP_201_CREATED)


class AdminApiKeyView(_KeyRoutes):
    admin_only = True

    @extend_schema(operation_id="adminDeleteTeamAPIKey", responses={204: None, **errors(400, 404)})
    def delete(self, request: Request, team_id: str, api_key_id: str) -> Response:
        services.api_key_delete(team=team_of(request), key_id=api_key_id, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
