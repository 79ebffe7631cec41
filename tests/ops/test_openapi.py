"""The OpenAPI schema at /openapi.json names every E2B route and field exactly as on the
wire, and /docs renders it (Swagger UI served from this host)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

# Every E2B control-plane route this build serves (docs/ARCHITECTURE.md, "Routes"), with
# OpenAPI's {param} path syntax.
E2B_ROUTES = {
    "/v2/sandboxes": {"get", "post"},
    "/sandboxes": {"get", "post"},
    "/sandboxes/{sandboxID}": {"get", "delete"},
    "/v2/sandboxes/{sandboxID}/connect": {"post"},
    "/sandboxes/{sandboxID}/connect": {"post"},
    "/sandboxes/{sandboxID}/resume": {"post"},
    "/sandboxes/{sandboxID}/pause": {"post"},
    "/sandboxes/{sandboxID}/timeout": {"post"},
    "/sandboxes/{sandboxID}/refreshes": {"post"},
    "/sandboxes/{sandboxID}/metrics": {"get"},
    "/sandboxes/{sandboxID}/snapshots": {"post"},
    "/sandboxes/{sandboxID}/fork": {"post"},
    "/snapshots": {"get"},
    "/templates": {"get"},
    "/templates/aliases/{alias}": {"get"},
    "/templates/{templateID}": {"get", "delete", "patch"},
    "/health": {"get"},
    "/v2/templates": {"get"},
    "/v2/templates/{templateID}": {"patch"},
    "/teams": {"get"},
    "/api-keys": {"get", "post"},
    "/api-keys/{apiKeyID}": {"patch", "delete"},
    "/access-tokens": {"post"},
    "/access-tokens/{accessTokenID}": {"delete"},
    "/admin/teams/{teamID}/sandboxes/kill": {"post"},
    "/admin/sandboxes/running-counts": {"get"},
    "/admin/teams/{teamID}/builds/cancel": {"post"},
    "/admin/teams/{teamID}/api-keys": {"post"},
    "/admin/teams/{teamID}/api-keys/{apiKeyID}": {"delete"},
}


@pytest.fixture
def schema(anonymous_client: APIClient) -> dict[str, Any]:
    response = anonymous_client.get("/openapi.json")
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


def _properties(schema: dict[str, Any], name: str) -> set[str]:
    return set(schema["components"]["schemas"][name]["properties"])


def test_openapi_lists_every_e2b_route_with_its_methods(schema: dict[str, Any]) -> None:
    paths = schema["paths"]

    for route, methods in E2B_ROUTES.items():
        assert route in paths, f"{route} missing from /openapi.json"
        assert methods <= set(paths[route]), f"{route}: {set(paths[route])}"


def test_openapi_path_parameters_use_wire_names(schema: dict[str, Any]) -> None:
    params = {
        p["name"]
        for item in schema["paths"].values()
        for op in item.values()
        if isinstance(op, dict)
        for p in op.get("parameters", [])
        if p["in"] == "path"
    }

    assert {"sandboxID", "templateID", "alias"} <= params
    assert not params & {"sandbox_id", "template_id"}


def test_openapi_bodies_use_wire_field_names(schema: dict[str, Any]) -> None:
    sandbox_create = schema["paths"]["/v2/sandboxes"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]["$ref"].rsplit("/", 1)[-1]
    created = schema["paths"]["/v2/sandboxes"]["post"]["responses"]["201"]["content"][
        "application/json"
    ]["schema"]["$ref"].rsplit("/", 1)[-1]

    assert {"templateID", "timeout", "metadata", "envVars", "autoPause"} <= _properties(
        schema, sandbox_create
    )
    assert {
        "sandboxID",
        "templateID",
        "clientID",
        "envdVersion",
        "envdAccessToken",
    } <= _properties(schema, created)
    every_property = {
        prop for s in schema["components"]["schemas"].values() for prop in s.get("properties", {})
    }
    assert not every_property & {"sandbox_id", "template_id", "client_id", "envd_version"}


def test_openapi_documents_the_idempotency_key_header(schema: dict[str, Any]) -> None:
    headers = {
        p["name"]
        for p in schema["paths"]["/v2/sandboxes"]["post"].get("parameters", [])
        if p["in"] == "header"
    }

    assert "Idempotency-Key" in headers


def test_docs_page_renders(anonymous_client: APIClient) -> None:
    response = anonymous_client.get("/docs")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "swagger-ui" in page
    assert "/openapi.json" in page


def test_openapi_documents_domain_as_a_string_that_is_never_null(schema: dict[str, Any]) -> None:
    # The server always answers SANDBOX_DOMAIN: a null would send the SDKs to e2b.app.
    for name in ("Sandbox", "SandboxDetail"):
        component = schema["components"]["schemas"][name]
        assert component["properties"]["domain"]["type"] == "string"
        assert not component["properties"]["domain"].get("nullable", False)
        assert "domain" in component["required"]
