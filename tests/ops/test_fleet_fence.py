"""A host of a fleet whose fence has run out (e2bfacade/fleet/host.py) does no sandbox work
and tells the front so: the nodes seam gives it no runtime (503 ``host_fenced``, worth a
retry through the front) and its readiness fails. A fleet of one has no fence."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.fleet import host as fleet_host


@pytest.fixture
def in_a_fleet(settings: Any, runtime: Any) -> Path:
    settings.ETCD_ENDPOINTS = ["http://127.0.0.1:9"]
    state = fleet_host.state_dir()
    state.mkdir(parents=True, exist_ok=True)
    (state / "serving").unlink(missing_ok=True)
    return state


def write_fence(state: Path, seconds: float) -> None:
    until = time.monotonic() + seconds
    (state / "serving").write_text(json.dumps({"incarnation": 7, "until": until}))


def test_a_fenced_host_refuses_sandbox_work_and_is_not_ready(
    in_a_fleet: Path, create_sandbox: Callable[..., Any], anonymous_client: APIClient
) -> None:
    write_fence(in_a_fleet, -1)  # ran out a second ago
    refused = create_sandbox()
    assert refused.status_code == 503, refused.content
    assert refused.json()["error_code"] == "host_fenced"
    assert refused["Should-Retry"] == "true"
    ready = anonymous_client.get("/health/ready")
    assert ready.status_code == 503
    assert ready.json()["checks"]["fleet"] == "failed: ServiceUnavailable"


def test_a_host_whose_fence_holds_serves(
    in_a_fleet: Path, create_sandbox: Callable[..., Any], anonymous_client: APIClient
) -> None:
    write_fence(in_a_fleet, 30)
    created = create_sandbox()
    assert created.status_code == 201, created.content
    assert anonymous_client.get("/health/ready").json()["checks"]["fleet"] == "ok"


def test_a_fleet_of_one_has_no_fence(
    settings: Any, runtime: Any, anonymous_client: APIClient
) -> None:
    assert settings.ETCD_ENDPOINTS == []
    assert "fleet" not in anonymous_client.get("/health/ready").json()["checks"]
