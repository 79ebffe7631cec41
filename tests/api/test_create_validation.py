"""Create refuses what it cannot honour, by field name, and a refused create leaves nothing
behind: no sandbox row and no sandbox in the runtime."""

from __future__ import annotations

import re
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.runtime.local import LocalRuntime
from sandboxes.models import Sandbox
from tests.api.helpers import assert_error

ROUTES = ["/v2/sandboxes", "/sandboxes"]


def assert_nothing_created(runtime: LocalRuntime) -> None:
    assert Sandbox.objects.count() == 0
    assert runtime.list() == []


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("allow_internet_access", True),
        ("network", {"denyOut": ["0.0.0.0/0"]}),
        ("network", {"allowOut": ["1.1.1.1"]}),
        ("mcp", {"github": {"token": "x"}}),
        # iam is supported; a token type other than E2B's one is not.
        ("iam", {"tokens": {"aws": {"audience": "sts.amazonaws.com", "tokenType": "OIDC"}}}),
    ],
)
def test_an_unsupported_create_field_is_refused_by_name(
    api_client: APIClient, runtime: LocalRuntime, route: str, field: str, value: Any
) -> None:
    response = api_client.post(route, {"templateID": "base", field: value}, format="json")

    body = assert_error(response, 400)
    assert body["message"].startswith(f"{field}: ")
    assert_nothing_created(runtime)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("allow_internet_access", False),
        ("allow_internet_access", None),
        ("network", None),
        ("network", {}),
        ("mcp", None),
        ("volumeMounts", []),
        ("autoPauseMemory", True),
        ("autoResume", {"enabled": False}),
        ("autoResume", None),
        ("secure", True),
        ("metadata", {}),
        ("envVars", {}),
        ("someFieldFromTheFuture", 42),
    ],
)
def test_a_harmless_value_of_such_a_field_is_accepted(
    api_client: APIClient, field: str, value: Any
) -> None:
    response = api_client.post("/v2/sandboxes", {"templateID": "base", field: value}, format="json")

    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"templateID": "base", "timeout": "5"}, "timeout"),
        ({"templateID": "base", "timeout": True}, "timeout"),
        ({"templateID": "base", "timeout": 1.5}, "timeout"),
        ({"templateID": "base", "timeout": 0}, "timeout"),
        ({"templateID": "base", "timeout": -1}, "timeout"),
        ({"templateID": "base", "metadata": {"a": 1}}, "metadata"),
        ({"templateID": "base", "metadata": ["a"]}, "metadata"),
        ({"templateID": "base", "envVars": {"1BAD": "x"}}, "envVars"),
        ({"templateID": "base", "envVars": {"A": 1}}, "envVars"),
        ({"templateID": "base", "autoPause": "yes"}, "autoPause"),
        ({"templateID": 5}, "templateID"),
        ({"templateID": ""}, "templateID"),
        ({}, "templateID"),
    ],
)
def test_a_wrongly_typed_create_body_is_a_400_naming_the_field_and_creates_nothing(
    api_client: APIClient, runtime: LocalRuntime, body: dict[str, Any], field: str
) -> None:
    response = api_client.post("/v2/sandboxes", body, format="json")

    error = assert_error(response, 400)
    assert re.match(rf"{field}[.:]", error["message"]), error
    assert error.get("error_code") == "validation_error"
    assert_nothing_created(runtime)


def test_a_timeout_over_the_maximum_is_refused_and_the_maximum_itself_is_accepted(
    api_client: APIClient, runtime: LocalRuntime, settings: Any
) -> None:
    settings.SANDBOX_MAX_TIMEOUT_SECONDS = 100

    refused = api_client.post(
        "/v2/sandboxes", {"templateID": "base", "timeout": 101}, format="json"
    )

    assert "maximum" in assert_error(refused, 400)["message"]
    assert_nothing_created(runtime)

    accepted = api_client.post(
        "/v2/sandboxes", {"templateID": "base", "timeout": 100}, format="json"
    )

    assert accepted.status_code == 201


def test_an_unknown_template_is_a_404_and_creates_nothing(
    api_client: APIClient, runtime: LocalRuntime
) -> None:
    response = api_client.post("/v2/sandboxes", {"templateID": "no-such-template"}, format="json")

    assert "no-such-template" in assert_error(response, 404)["message"]
    assert_nothing_created(runtime)


@pytest.mark.parametrize("raw", ['"x"', "5", "true", "null", "[1]"])
def test_a_create_body_that_is_not_an_object_is_a_400(
    api_client: APIClient, runtime: LocalRuntime, raw: str
) -> None:
    response = api_client.post("/v2/sandboxes", raw, content_type="application/json")

    assert_error(response, 400)
    assert_nothing_created(runtime)


def test_a_create_body_that_is_an_empty_array_is_a_400(
    api_client: APIClient, runtime: LocalRuntime
) -> None:
    response = api_client.post("/v2/sandboxes", "[]", content_type="application/json")

    assert_error(response, 400)
    assert_nothing_created(runtime)


def test_a_create_body_that_is_not_json_is_a_400(
    api_client: APIClient, runtime: LocalRuntime
) -> None:
    response = api_client.post(
        "/v2/sandboxes", "{templateID: base", content_type="application/json"
    )

    assert_error(response, 400)
    assert_nothing_created(runtime)


@pytest.mark.parametrize("raw", ['"x"', "5", "[1]"])
@pytest.mark.parametrize("route", ["/sandboxes/{}/pause", "/v2/sandboxes/{}/connect"])
def test_a_pause_or_connect_body_that_is_not_an_object_is_a_400(
    api_client: APIClient, route: str, raw: str
) -> None:
    sandbox_id = api_client.post("/v2/sandboxes", {"templateID": "base"}, format="json").json()[
        "sandboxID"
    ]

    response = api_client.post(route.format(sandbox_id), raw, content_type="application/json")

    assert "JSON object" in assert_error(response, 400)["message"]
    assert Sandbox.objects.get(pk=sandbox_id).state == Sandbox.State.RUNNING


@pytest.mark.parametrize("raw", ["[]", '""'])
def test_an_empty_array_or_string_as_a_pause_body_is_a_400(api_client: APIClient, raw: str) -> None:
    sandbox_id = api_client.post("/v2/sandboxes", {"templateID": "base"}, format="json").json()[
        "sandboxID"
    ]

    response = api_client.post(
        f"/sandboxes/{sandbox_id}/pause", raw, content_type="application/json"
    )

    assert_error(response, 400)


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("/sandboxes/{}/pause", {"memory": "yes"}, "memory"),
        ("/v2/sandboxes/{}/connect", {"timeout": "60"}, "timeout"),
        ("/v2/sandboxes/{}/connect", {"timeout": 0}, "timeout"),
        ("/v2/sandboxes/{}/connect", {"memory": "no"}, "memory"),
        ("/sandboxes/{}/resume", {"timeout": 1.5}, "timeout"),
        ("/sandboxes/{}/timeout", {"timeout": True}, "timeout"),
        ("/sandboxes/{}/refreshes", {"duration": -1}, "duration"),
    ],
)
def test_a_lifecycle_body_with_a_bad_field_is_a_400_naming_it(
    api_client: APIClient, route: str, body: dict[str, Any], field: str
) -> None:
    sandbox_id = api_client.post("/v2/sandboxes", {"templateID": "base"}, format="json").json()[
        "sandboxID"
    ]
    before = Sandbox.objects.get(pk=sandbox_id)

    response = api_client.post(route.format(sandbox_id), body, format="json")

    assert assert_error(response, 400)["message"].startswith(f"{field}: ")
    after = Sandbox.objects.get(pk=sandbox_id)
    assert (after.state, after.end_at) == (before.state, before.end_at)
