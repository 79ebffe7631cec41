"""E2B's wire shapes for teams, keys and tokens (``Team``, ``TeamAPIKey``,
``CreatedTeamAPIKey``, ``CreatedAccessToken``), and their OpenAPI descriptions."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from e2bfacade.models import AccessToken, ApiKey, Team

_when = serializers.DateTimeField().to_representation


def team_wire(team: Team) -> dict[str, Any]:
    # ``apiKey``: E2B once answered the team's raw key here. Keys are stored hashed, so
    # there is none to give: make one with POST /api-keys.
    return {"teamID": str(team.pk), "name": team.name, "apiKey": "", "isDefault": True}


def api_key_wire(key: ApiKey) -> dict[str, Any]:
    return {
        "id": str(key.public_id),
        "name": key.name,
        "mask": key.mask.wire(),
        "createdAt": _when(key.created_at),
        "createdBy": None,  # keys are made by a team's token or the operator, not a user
        "lastUsed": _when(key.last_used_at) if key.last_used_at else None,
    }


def created_api_key_wire(key: ApiKey, raw: str) -> dict[str, Any]:
    return {**api_key_wire(key), "key": raw}


def created_access_token_wire(token: AccessToken, raw: str) -> dict[str, Any]:
    return {
        "id": str(token.pk),
        "name": token.name,
        "token": raw,
        "mask": token.mask.wire(),
        "createdAt": _when(token.created_at),
    }


# --- OpenAPI (the views answer the dicts above; these describe them) ------------------
class IdentifierMaskingDetails(serializers.Serializer[Any]):
    prefix = serializers.CharField()
    valueLength = serializers.IntegerField()
    maskedValuePrefix = serializers.CharField()
    maskedValueSuffix = serializers.CharField()


class TeamSerializer(serializers.Serializer[Any]):
    teamID = serializers.CharField()
    name = serializers.CharField()
    apiKey = serializers.CharField()
    isDefault = serializers.BooleanField()


class TeamAPIKey(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    name = serializers.CharField()
    mask = IdentifierMaskingDetails()
    createdAt = serializers.DateTimeField()
    createdBy = serializers.JSONField(allow_null=True)
    lastUsed = serializers.DateTimeField(allow_null=True)


class CreatedTeamAPIKey(TeamAPIKey):
    key = serializers.CharField()


class NewTeamAPIKey(serializers.Serializer[Any]):
    name = serializers.CharField()


class UpdateTeamAPIKey(serializers.Serializer[Any]):
    name = serializers.CharField()


class NewAccessToken(serializers.Serializer[Any]):
    name = serializers.CharField()


class CreatedAccessToken(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    name = serializers.CharField()
    token = serializers.CharField()
    mask = IdentifierMaskingDetails()
    createdAt = serializers.DateTimeField()
