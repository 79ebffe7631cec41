"""OpenAPI description helpers: the error shape and the X-API-Key scheme."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, inline_serializer
from rest_framework import serializers

ErrorSerializer = inline_serializer(
    name="Error",
    fields={
        "code": serializers.IntegerField(help_text="equal to the HTTP status"),
        "message": serializers.CharField(),
        "error_code": serializers.CharField(required=False),
    },
)


def errors(*statuses: int) -> dict[int, OpenApiResponse]:
    """The error responses of a route, all in E2B's error shape (plus 401, always)."""
    return {s: OpenApiResponse(ErrorSerializer) for s in sorted({401, *statuses})}


class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "e2bfacade.auth.ApiKeyAuthentication"
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "header", "name": "X-API-Key"}


class AccessTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "e2bfacade.auth.AccessTokenAuthentication"
    name = "AccessTokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "access_token"}


class AdminTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "e2bfacade.auth.AdminTokenAuthentication"
    name = "AdminApiKeyAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "header", "name": "X-Admin-Token"}


class NoApiKeyHereScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """Not a credential (it only words the 401): left out of the schema."""

    target_class = "e2bfacade.auth.NoApiKeyHere"
    name = "AdminTeamAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "header", "name": "X-Team-ID"}


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    description="1-255 of a-z, 0-9, '-'; team-scoped; see docs/idempotency.md",
)

# A field E2B defines and this server always answers with null (e.g. ``trafficAccessToken``).
NULLABLE_STRING = serializers.CharField(allow_null=True)


# URL kwargs are snake_case (Python), E2B's path parameters camelCase: the schema shows the
# wire names, as E2B's own OpenAPI does (``/sandboxes/{sandboxID}``).
WIRE_PATH_PARAMETERS = {
    "sandbox_id": "sandboxID",
    "template_id": "templateID",
    "build_id": "buildID",
    "files_hash": "hash",
    "team_id": "teamID",
    "api_key_id": "apiKeyID",
    "access_token_id": "accessTokenID",
}


def wire_path_parameters(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: rename path parameters to their wire names."""
    paths: dict[str, Any] = {}
    for path, item in result.get("paths", {}).items():
        for python, wire in WIRE_PATH_PARAMETERS.items():
            path = path.replace("{" + python + "}", "{" + wire + "}")
        for operation in item.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("in") == "path":
                    parameter["name"] = WIRE_PATH_PARAMETERS.get(
                        parameter["name"], parameter["name"]
                    )
        paths[path] = item
    result["paths"] = paths
    return result
