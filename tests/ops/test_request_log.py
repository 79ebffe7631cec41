"""One structured JSON line per request on the ``e2bfacade.request`` logger: request id,
method, route pattern, status, duration, team, idempotency outcome — and never a body, an
API key or an Idempotency-Key value."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey
from e2bfacade.observability import JsonFormatter
from e2bfacade.runtime.local import LocalRuntime

pytestmark = pytest.mark.django_db

Log = Callable[[], list[dict[str, Any]]]
FIELDS = {
    "ts",
    "level",
    "logger",
    "msg",
    "request_id",
    "method",
    "route",
    "path",
    "status",
    "duration_ms",
    "team_id",
    "idempotency_key",
    "idempotency",
}


def test_each_request_logs_one_json_line_with_every_field(
    api_client: APIClient, api_key: ApiKey, request_log: Log
) -> None:
    api_client.get("/sandboxes/inosuchsandbox")

    [line] = request_log()
    assert set(line) == FIELDS
    assert line["logger"] == "e2bfacade.request"
    assert line["method"] == "GET"
    assert line["route"] == "/sandboxes/<str:sandbox_id>"
    assert line["path"] == "/sandboxes/inosuchsandbox"
    assert line["status"] == 404
    assert line["team_id"] == api_key.team_id
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert line["idempotency_key"] is False
    assert line["idempotency"] is None
    assert line["ts"].endswith("+00:00")


def test_an_unauthenticated_request_logs_no_team(
    anonymous_client: APIClient, request_log: Log
) -> None:
    anonymous_client.get("/sandboxes", HTTP_X_API_KEY="e2b_wrong")

    [line] = request_log()
    assert line["status"] == 401
    assert line["team_id"] is None
    assert "e2b_wrong" not in json.dumps(line)


def test_a_sane_request_id_is_echoed_and_logged(
    anonymous_client: APIClient, request_log: Log
) -> None:
    response = anonymous_client.get("/health", HTTP_X_REQUEST_ID="edge-7f3a.42")

    assert response["X-Request-Id"] == "edge-7f3a.42"
    assert request_log()[0]["request_id"] == "edge-7f3a.42"


@pytest.mark.parametrize("bad", ["", "x" * 200, "has space", 'quote"d', "new\nline"])
def test_an_insane_request_id_is_replaced_by_a_fresh_one(
    anonymous_client: APIClient, request_log: Log, bad: str
) -> None:
    response = anonymous_client.get("/health", HTTP_X_REQUEST_ID=bad)

    generated = response["X-Request-Id"]
    assert generated != bad and len(generated) == 32
    assert request_log()[0]["request_id"] == generated


def test_every_response_carries_a_request_id(
    anonymous_client: APIClient, api_client: APIClient
) -> None:
    ids = {
        anonymous_client.get("/health")["X-Request-Id"],
        anonymous_client.get("/metrics")["X-Request-Id"],
        api_client.get("/no/such/route")["X-Request-Id"],
        api_client.post("/v2/sandboxes", b"{", content_type="application/json")["X-Request-Id"],
    }

    assert len(ids) == 4


def test_keyed_create_logs_its_idempotency_outcome_but_no_key_body_or_token(
    api_client: APIClient,
    api_key: ApiKey,
    create_sandbox: Callable[..., Any],
    runtime: LocalRuntime,
    request_log: Log,
) -> None:
    key = "log-outcome-key-1"
    first = create_sandbox(key=key, metadata={"owner": "log-test"})
    replay = create_sandbox(key=key, metadata={"owner": "log-test"})
    mismatch = create_sandbox(key=key, metadata={"owner": "someone-else"})
    unkeyed = create_sandbox()

    lines = request_log()
    assert [line["idempotency"] for line in lines] == ["executed", "replay", "mismatch", None]
    assert [line["idempotency_key"] for line in lines] == [True, True, True, False]
    assert [line["status"] for line in lines] == [201, 201, 409, 201]
    assert {line["route"] for line in lines} == {"/v2/sandboxes"}
    text = "\n".join(json.dumps(line) for line in lines)
    token = first.json()["envdAccessToken"]
    assert replay.json()["envdAccessToken"] == token
    for secret in (key, token, api_key.raw, "log-test", unkeyed.json()["envdAccessToken"]):  # type: ignore[attr-defined]
        assert secret not in text
    assert mismatch.status_code == 409


def test_the_json_formatter_keeps_exceptions_on_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "e2bfacade.request", logging.ERROR, __file__, 1, "failed", None, exc_info
    )

    text = JsonFormatter().format(record)

    assert "\n" not in text
    parsed = json.loads(text)
    assert parsed["msg"] == "failed"
    assert "ValueError: boom" in parsed["exc"]
