"""``/health`` (liveness: checks nothing) and ``/health/ready`` (the database and the sandbox
runtime), both without an API key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db.utils import OperationalError
from rest_framework.test import APIClient

from e2bfacade import views
from e2bfacade.runtime.local import LocalRuntime

pytestmark = pytest.mark.django_db


def test_health_answers_without_an_api_key(anonymous_client: APIClient) -> None:
    response = anonymous_client.get("/health")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_ready_checks_the_database_and_the_runtime(
    anonymous_client: APIClient, runtime: LocalRuntime
) -> None:
    response = anonymous_client.get("/health/ready")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "runtime": "ok"}}


def test_ready_answers_503_in_e2b_shape_naming_the_database_when_it_is_down(
    anonymous_client: APIClient, runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def database_down() -> None:
        raise OperationalError("connection refused (password=hunter2)")

    monkeypatch.setitem(views.READINESS_CHECKS, "database", database_down)

    response = anonymous_client.get("/health/ready")

    assert response.status_code == 503
    body = response.json()
    assert body["code"] == 503
    assert body["message"] == "not ready: database check failed"
    assert body["checks"] == {"database": "failed: OperationalError", "runtime": "ok"}
    # The exception's text goes to the log only: this route is public.
    assert "hunter2" not in response.content.decode()


def test_ready_answers_503_naming_the_runtime_when_sandbox_root_is_unusable(
    anonymous_client: APIClient, settings: Any, tmp_path: Path
) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    settings.SANDBOX_ROOT = not_a_directory / "root"

    response = anonymous_client.get("/health/ready")

    assert response.status_code == 503
    body = response.json()
    assert body["code"] == 503
    assert "runtime" in body["message"]
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["runtime"].startswith("failed: ")


def test_health_and_ready_echo_the_request_id(anonymous_client: APIClient) -> None:
    response = anonymous_client.get("/health", HTTP_X_REQUEST_ID="lb-probe-42")

    assert response["X-Request-Id"] == "lb-probe-42"
