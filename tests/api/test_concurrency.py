"""Several callers on one sandbox at once (PostgreSQL): the row lock admits one transition,
the runtime acts once, and every other caller gets the answer the retry table promises."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey
from e2bfacade.runtime.base import SandboxState
from e2bfacade.runtime.local import LocalRuntime
from sandboxes.models import Sandbox
from tests.api.helpers import NOT_FOUND, postgres_only, run_at_once, runtime_state

CreateSandbox = Callable[..., dict[str, Any]]
CALLERS = 8

pytestmark = [postgres_only, pytest.mark.django_db(transaction=True)]


def client_of(api_key: ApiKey) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=api_key.raw)  # type: ignore[attr-defined]
    return client


def count_calls(monkeypatch: pytest.MonkeyPatch, runtime: LocalRuntime, name: str) -> list[str]:
    """Record every call of the runtime's ``name`` (the real method still runs)."""
    calls: list[str] = []
    real = getattr(runtime, name)

    def spy(sandbox_id: str, **kwargs: Any) -> Any:
        calls.append(sandbox_id)
        return real(sandbox_id, **kwargs)

    monkeypatch.setattr(runtime, name, spy)
    return calls


def test_eight_pauses_at_once_give_one_204_and_seven_409_and_one_freeze(
    api_key: ApiKey,
    create_sandbox: CreateSandbox,
    runtime: LocalRuntime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    freezes = count_calls(monkeypatch, runtime, "pause")

    responses = run_at_once(
        CALLERS, lambda i: client_of(api_key).post(f"/sandboxes/{sandbox_id}/pause")
    )

    assert Counter(r.status_code for r in responses) == {204: 1, 409: CALLERS - 1}
    for r in responses:
        if r.status_code == 409:
            assert r.json()["code"] == 409
            assert "already" in r.json()["message"]
    assert freezes == [sandbox_id]
    assert Sandbox.objects.get(pk=sandbox_id).state == Sandbox.State.PAUSED
    assert runtime_state(runtime, sandbox_id) is SandboxState.PAUSED


def test_eight_deletes_at_once_give_one_204_and_seven_404_and_the_sandbox_is_gone(
    api_key: ApiKey, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]

    responses = run_at_once(
        CALLERS, lambda i: client_of(api_key).delete(f"/sandboxes/{sandbox_id}")
    )

    assert Counter(r.status_code for r in responses) == {204: 1, 404: CALLERS - 1}
    for r in responses:
        if r.status_code == 404:
            assert r.json() == {"code": 404, "message": NOT_FOUND.format(sandbox_id)}
    assert Sandbox.objects.get(pk=sandbox_id).state == Sandbox.State.KILLED
    assert runtime_state(runtime, sandbox_id) is None


def test_eight_connects_at_once_to_a_paused_sandbox_resume_it_once(
    api_key: ApiKey,
    create_sandbox: CreateSandbox,
    runtime: LocalRuntime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    assert client_of(api_key).post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
    thaws = count_calls(monkeypatch, runtime, "resume")

    responses = run_at_once(
        CALLERS, lambda i: client_of(api_key).post(f"/v2/sandboxes/{sandbox_id}/connect")
    )

    # The retry table (docs/idempotency.md, "Retry table"): resumed once (201), the rest 200.
    assert Counter(r.status_code for r in responses) == {201: 1, 200: CALLERS - 1}
    assert {r.json()["sandboxID"] for r in responses} == {sandbox_id}
    assert thaws == [sandbox_id]
    assert Sandbox.objects.get(pk=sandbox_id).state == Sandbox.State.RUNNING
    assert runtime_state(runtime, sandbox_id) is SandboxState.RUNNING


def test_pauses_and_connects_racing_leave_database_and_runtime_in_agreement(
    api_key: ApiKey, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]

    def pause_or_connect(i: int) -> Any:
        client = client_of(api_key)
        if i % 2:
            return client.post(f"/sandboxes/{sandbox_id}/pause")
        return client.post(f"/v2/sandboxes/{sandbox_id}/connect")

    responses = run_at_once(CALLERS, pause_or_connect)

    assert {r.status_code for r in responses} <= {200, 201, 204, 409}
    state = Sandbox.State(Sandbox.objects.get(pk=sandbox_id).state)
    expected = {
        Sandbox.State.PAUSED: SandboxState.PAUSED,
        Sandbox.State.RUNNING: SandboxState.RUNNING,
    }
    assert state in expected
    assert runtime_state(runtime, sandbox_id) is expected[state]
