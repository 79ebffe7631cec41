"""The sandbox state machine through the API, checked on both sides: the database row and
what the real local runtime reports."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.runtime.base import SandboxState
from e2bfacade.runtime.local import LocalRuntime
from sandboxes.models import Sandbox
from tests.api.helpers import NOT_FOUND, assert_error, runtime_state, seconds_from_now

CreateSandbox = Callable[..., dict[str, Any]]
State = Sandbox.State


def row(sandbox_id: str) -> Sandbox:
    return Sandbox.objects.get(pk=sandbox_id)


def test_create_answers_201_with_a_running_sandbox_in_the_database_and_the_runtime(
    api_client: APIClient, runtime: LocalRuntime
) -> None:
    response = api_client.post(
        "/v2/sandboxes",
        {"templateID": "base", "timeout": 60, "metadata": {"k": "v"}},
        format="json",
    )

    assert response.status_code == 201
    body = response.json()
    assert body["templateID"] == "base"
    assert body["alias"] == "base"
    assert body["clientID"] and body["envdVersion"] and body["envdAccessToken"]
    sandbox = row(body["sandboxID"])
    assert sandbox.state == State.RUNNING
    assert sandbox.metadata == {"k": "v"}
    assert sandbox.end_at - sandbox.started_at == timedelta(seconds=60)
    assert runtime_state(runtime, body["sandboxID"]) is SandboxState.RUNNING


def test_create_without_a_timeout_uses_300_seconds_on_v2_and_15_on_v1(
    api_client: APIClient,
) -> None:
    v2 = api_client.post("/v2/sandboxes", {"templateID": "base"}, format="json")
    v1 = api_client.post("/sandboxes", {"templateID": "base"}, format="json")

    assert v2.status_code == v1.status_code == 201
    for body, seconds in ((v2.json(), 300), (v1.json(), 15)):
        sandbox = row(body["sandboxID"])
        assert sandbox.end_at - sandbox.started_at == timedelta(seconds=seconds)


def test_get_shows_the_detail_of_a_running_sandbox(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox(timeout=60, metadata={"owner": "me"})["sandboxID"]

    response = api_client.get(f"/sandboxes/{sandbox_id}")

    assert response.status_code == 200
    body = response.json()
    assert body["sandboxID"] == sandbox_id
    assert body["state"] == "running"
    assert body["metadata"] == {"owner": "me"}
    assert body["lifecycle"] == {"autoResume": False, "onTimeout": "kill"}
    for field in (
        "templateID",
        "clientID",
        "startedAt",
        "endAt",
        "cpuCount",
        "memoryMB",
        "diskSizeMB",
        "envdVersion",
        "envdAccessToken",
        "pauseMode",
    ):
        assert field in body


def test_pause_answers_204_and_freezes_the_sandbox_then_a_second_pause_answers_409(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]

    first = api_client.post(f"/sandboxes/{sandbox_id}/pause", {}, format="json")

    assert first.status_code == 204
    assert row(sandbox_id).state == State.PAUSED
    assert runtime_state(runtime, sandbox_id) is SandboxState.PAUSED
    assert api_client.get(f"/sandboxes/{sandbox_id}").json()["state"] == "paused"

    second = api_client.post(f"/sandboxes/{sandbox_id}/pause", {}, format="json")

    assert "already paused" in assert_error(second, 409)["message"]
    assert row(sandbox_id).state == State.PAUSED
    assert runtime_state(runtime, sandbox_id) is SandboxState.PAUSED


def test_pause_and_connect_without_a_body_apply_the_defaults(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox(timeout=10)["sandboxID"]

    paused = api_client.post(f"/sandboxes/{sandbox_id}/pause")
    resumed = api_client.post(f"/v2/sandboxes/{sandbox_id}/connect")

    assert paused.status_code == 204
    assert resumed.status_code == 201
    # connect's default timeout is 300 s.
    assert seconds_from_now(row(sandbox_id).end_at) == pytest.approx(300, abs=5)
    assert runtime_state(runtime, sandbox_id) is SandboxState.RUNNING


def test_pause_and_connect_with_an_empty_json_body_apply_the_defaults(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox(timeout=10)["sandboxID"]

    paused = api_client.post(f"/sandboxes/{sandbox_id}/pause", content_type="application/json")
    resumed = api_client.post(
        f"/v2/sandboxes/{sandbox_id}/connect", content_type="application/json"
    )

    assert (paused.status_code, resumed.status_code) == (204, 201)


@pytest.mark.parametrize("route", ["/v2/sandboxes/{}/connect", "/sandboxes/{}/connect"])
def test_connect_resumes_a_paused_sandbox_with_201_and_end_time_now_plus_timeout(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime, route: str
) -> None:
    sandbox_id = create_sandbox(timeout=3600)["sandboxID"]
    api_client.post(f"/sandboxes/{sandbox_id}/pause")

    response = api_client.post(route.format(sandbox_id), {"timeout": 120}, format="json")

    assert response.status_code == 201
    assert response.json()["sandboxID"] == sandbox_id
    sandbox = row(sandbox_id)
    assert sandbox.state == State.RUNNING
    # Resumed: the end time restarts from now, even though it was later before.
    assert seconds_from_now(sandbox.end_at) == pytest.approx(120, abs=5)
    assert runtime_state(runtime, sandbox_id) is SandboxState.RUNNING


@pytest.mark.parametrize("route", ["/v2/sandboxes/{}/connect", "/sandboxes/{}/connect"])
def test_connect_on_a_running_sandbox_answers_200_and_only_extends_the_end_time(
    api_client: APIClient, create_sandbox: CreateSandbox, route: str
) -> None:
    sandbox_id = create_sandbox(timeout=3600)["sandboxID"]
    end_before = row(sandbox_id).end_at

    shorter = api_client.post(route.format(sandbox_id), {"timeout": 10}, format="json")

    assert shorter.status_code == 200
    assert shorter.json()["sandboxID"] == sandbox_id
    assert row(sandbox_id).end_at == end_before

    longer = api_client.post(route.format(sandbox_id), {"timeout": 7200}, format="json")

    assert longer.status_code == 200
    assert seconds_from_now(row(sandbox_id).end_at) == pytest.approx(7200, abs=5)
    assert row(sandbox_id).state == State.RUNNING


def test_legacy_resume_answers_201_then_409_already_running(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    api_client.post(f"/sandboxes/{sandbox_id}/pause")

    first = api_client.post(f"/sandboxes/{sandbox_id}/resume", {"timeout": 60}, format="json")
    second = api_client.post(f"/sandboxes/{sandbox_id}/resume", {"timeout": 60}, format="json")

    assert first.status_code == 201
    assert first.json()["sandboxID"] == sandbox_id
    assert seconds_from_now(row(sandbox_id).end_at) == pytest.approx(60, abs=5)
    assert "already running" in assert_error(second, 409)["message"]
    assert runtime_state(runtime, sandbox_id) is SandboxState.RUNNING


def test_legacy_resume_without_a_timeout_gives_15_seconds(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox(timeout=3600)["sandboxID"]
    api_client.post(f"/sandboxes/{sandbox_id}/pause")

    response = api_client.post(f"/sandboxes/{sandbox_id}/resume")

    assert response.status_code == 201
    assert seconds_from_now(row(sandbox_id).end_at) == pytest.approx(15, abs=5)


def test_timeout_on_a_paused_sandbox_answers_404(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    api_client.post(f"/sandboxes/{sandbox_id}/pause")
    end_before = row(sandbox_id).end_at

    response = api_client.post(f"/sandboxes/{sandbox_id}/timeout", {"timeout": 30}, format="json")

    assert assert_error(response, 404)["message"] == NOT_FOUND.format(sandbox_id)
    assert row(sandbox_id).end_at == end_before


def test_timeout_sets_the_end_time_and_may_shorten_it(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox(timeout=3600)["sandboxID"]

    response = api_client.post(f"/sandboxes/{sandbox_id}/timeout", {"timeout": 30}, format="json")

    assert response.status_code == 204
    assert seconds_from_now(row(sandbox_id).end_at) == pytest.approx(30, abs=5)


def test_a_timeout_of_zero_ends_the_sandbox_now_and_a_negative_one_is_refused(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox(timeout=3600)["sandboxID"]

    negative = api_client.post(f"/sandboxes/{sandbox_id}/timeout", {"timeout": -1}, format="json")
    assert "timeout" in assert_error(negative, 400)["message"]
    assert seconds_from_now(row(sandbox_id).end_at) > 3000

    response = api_client.post(f"/sandboxes/{sandbox_id}/timeout", {"timeout": 0}, format="json")

    assert response.status_code == 204
    assert seconds_from_now(row(sandbox_id).end_at) == pytest.approx(0, abs=2)


def test_timeout_requires_a_timeout_and_refuses_one_over_the_maximum(
    api_client: APIClient, create_sandbox: CreateSandbox, settings: Any
) -> None:
    settings.SANDBOX_MAX_TIMEOUT_SECONDS = 100
    sandbox_id = create_sandbox(timeout=50)["sandboxID"]
    end_before = row(sandbox_id).end_at

    missing = api_client.post(f"/sandboxes/{sandbox_id}/timeout", {}, format="json")
    too_long = api_client.post(f"/sandboxes/{sandbox_id}/timeout", {"timeout": 101}, format="json")

    assert "timeout" in assert_error(missing, 400)["message"]
    assert "maximum" in assert_error(too_long, 400)["message"]
    assert row(sandbox_id).end_at == end_before


@pytest.mark.parametrize(
    ("route", "paused"), [("/v2/sandboxes/{}/connect", False), ("/sandboxes/{}/resume", True)]
)
def test_connect_and_resume_refuse_a_timeout_over_the_maximum(
    api_client: APIClient, create_sandbox: CreateSandbox, settings: Any, route: str, paused: bool
) -> None:
    settings.SANDBOX_MAX_TIMEOUT_SECONDS = 100
    sandbox_id = create_sandbox(timeout=50)["sandboxID"]
    if paused:
        api_client.post(f"/sandboxes/{sandbox_id}/pause")
    before = row(sandbox_id)

    response = api_client.post(route.format(sandbox_id), {"timeout": 101}, format="json")

    assert "maximum" in assert_error(response, 400)["message"]
    after = row(sandbox_id)
    assert (after.state, after.end_at) == (before.state, before.end_at)


def test_refreshes_extend_the_end_time_but_never_shorten_it(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    long_id = create_sandbox(timeout=3600)["sandboxID"]
    short_id = create_sandbox(timeout=5)["sandboxID"]
    long_end = row(long_id).end_at

    kept = api_client.post(f"/sandboxes/{long_id}/refreshes", {"duration": 60}, format="json")
    extended = api_client.post(f"/sandboxes/{short_id}/refreshes", {"duration": 600}, format="json")

    assert (kept.status_code, extended.status_code) == (204, 204)
    assert row(long_id).end_at == long_end
    assert seconds_from_now(row(short_id).end_at) == pytest.approx(600, abs=5)


def test_a_refresh_without_a_duration_keeps_the_sandbox_alive_for_15_seconds(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox(timeout=1)["sandboxID"]

    response = api_client.post(f"/sandboxes/{sandbox_id}/refreshes")

    assert response.status_code == 204
    assert seconds_from_now(row(sandbox_id).end_at) == pytest.approx(15, abs=5)


def test_refreshes_refuse_a_duration_over_an_hour(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]

    response = api_client.post(
        f"/sandboxes/{sandbox_id}/refreshes", {"duration": 3601}, format="json"
    )

    assert "duration" in assert_error(response, 400)["message"]


def test_delete_answers_204_then_404_and_the_runtime_has_no_such_sandbox(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]

    first = api_client.delete(f"/sandboxes/{sandbox_id}")

    assert first.status_code == 204
    sandbox = row(sandbox_id)
    assert sandbox.state == State.KILLED
    assert sandbox.killed_at is not None
    assert runtime_state(runtime, sandbox_id) is None
    assert sandbox_id not in [info.sandbox_id for info in runtime.list()]

    second = api_client.delete(f"/sandboxes/{sandbox_id}")

    assert assert_error(second, 404)["message"] == NOT_FOUND.format(sandbox_id)
    assert_error(api_client.get(f"/sandboxes/{sandbox_id}"), 404)
    assert_error(api_client.post(f"/v2/sandboxes/{sandbox_id}/connect"), 404)


def test_delete_kills_a_paused_sandbox_too(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    api_client.post(f"/sandboxes/{sandbox_id}/pause")

    response = api_client.delete(f"/sandboxes/{sandbox_id}")

    assert response.status_code == 204
    assert row(sandbox_id).state == State.KILLED
    assert runtime_state(runtime, sandbox_id) is None


def test_an_unknown_sandbox_answers_404_on_every_route(api_client: APIClient) -> None:
    for method, path in (
        ("get", "/sandboxes/inope"),
        ("delete", "/sandboxes/inope"),
        ("post", "/sandboxes/inope/pause"),
        ("post", "/v2/sandboxes/inope/connect"),
    ):
        response = getattr(api_client, method)(path)
        assert assert_error(response, 404)["message"] == NOT_FOUND.format("inope")


# ------------------------------------------------------------------ transitions in flight
@pytest.mark.parametrize(
    ("in_flight", "route", "message"),
    [
        # Conflicts the service knows answer at once ...
        (State.PAUSING, "/sandboxes/{}/pause", "already being paused"),
        (State.RESUMING, "/sandboxes/{}/resume", "already being resumed"),
        # ... other transitions are waited out, then 409.
        (State.PAUSING, "/v2/sandboxes/{}/connect", "try again"),
        (State.RESUMING, "/sandboxes/{}/pause", "try again"),
        (State.RESUMING, "/v2/sandboxes/{}/connect", "try again"),
    ],
)
def test_a_call_during_another_transition_answers_409_within_the_wait(
    api_client: APIClient,
    create_sandbox: CreateSandbox,
    runtime: LocalRuntime,
    fast_transition_wait: float,
    in_flight: str,
    route: str,
    message: str,
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    Sandbox.objects.filter(pk=sandbox_id).update(state=in_flight)

    started = time.monotonic()
    response = api_client.post(route.format(sandbox_id))
    elapsed = time.monotonic() - started

    assert message in assert_error(response, 409)["message"]
    assert elapsed < fast_transition_wait + 2
    if message == "try again":
        assert elapsed >= fast_transition_wait
    assert row(sandbox_id).state == in_flight  # nobody else's transition was trampled
    assert runtime_state(runtime, sandbox_id) is SandboxState.RUNNING


def test_with_the_default_wait_a_connect_during_a_pause_answers_409_after_about_5_seconds(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    Sandbox.objects.filter(pk=sandbox_id).update(state=State.PAUSING)

    started = time.monotonic()
    response = api_client.post(f"/v2/sandboxes/{sandbox_id}/connect")
    elapsed = time.monotonic() - started

    assert_error(response, 409)
    assert 4.5 <= elapsed < 6.5


def test_a_call_waiting_on_a_transition_proceeds_once_it_finishes(
    api_client: APIClient, create_sandbox: CreateSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wait is a poll of the row: finish the transition from inside the wait, as a
    # concurrent caller would, and the waiting connect goes ahead.
    sandbox_id = create_sandbox(timeout=3600)["sandboxID"]
    Sandbox.objects.filter(pk=sandbox_id).update(state=State.RESUMING)
    real_sleep = time.sleep

    def finish_then_sleep(seconds: float) -> None:
        Sandbox.objects.filter(pk=sandbox_id).update(state=State.RUNNING)
        real_sleep(seconds)

    monkeypatch.setattr("sandboxes.transitions.time.sleep", finish_then_sleep)

    response = api_client.post(
        f"/v2/sandboxes/{sandbox_id}/connect", {"timeout": 60}, format="json"
    )

    assert response.status_code == 200


def test_connect_on_a_sandbox_being_killed_answers_409(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    Sandbox.objects.filter(pk=sandbox_id).update(state=State.KILLING)

    response = api_client.post(f"/v2/sandboxes/{sandbox_id}/connect")

    assert_error(response, 409)


# ----------------------------------------------------------------------------- metrics
def test_metrics_returns_one_sample_with_all_nine_fields(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    now = int(time.time())

    response = api_client.get(
        f"/sandboxes/{sandbox_id}/metrics", {"start": now - 60, "end": now + 60}
    )

    assert response.status_code == 200
    samples = response.json()
    assert len(samples) == 1
    sample = samples[0]
    assert set(sample) == {
        "timestamp",
        "timestampUnix",
        "cpuCount",
        "cpuUsedPct",
        "memUsed",
        "memTotal",
        "memCache",
        "diskUsed",
        "diskTotal",
    }
    assert sample["timestampUnix"] == pytest.approx(now, abs=5)
    assert sample["cpuCount"] == 2
    assert sample["memTotal"] == 512 * 1024 * 1024
    assert sample["memUsed"] > 0
    assert sample["diskTotal"] == 1024 * 1024 * 1024
    assert 0 <= sample["cpuUsedPct"] <= 100


def test_metrics_of_a_paused_sandbox_are_still_reported(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    api_client.post(f"/sandboxes/{sandbox_id}/pause")

    response = api_client.get(f"/sandboxes/{sandbox_id}/metrics")

    assert response.status_code == 200
    assert len(response.json()) == 1


def test_metrics_outside_the_requested_window_are_an_empty_list(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]

    response = api_client.get(f"/sandboxes/{sandbox_id}/metrics", {"start": 0, "end": 1000})

    assert response.status_code == 200
    assert response.json() == []
