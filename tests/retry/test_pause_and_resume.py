"""The retry table's pause row and the legacy resume row (``POST /sandboxes/{id}/resume``)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.retry.support import (
    ROUNDS,
    SEQUENTIAL,
    checked,
    concurrently,
    pause,
    post,
    sequential,
    statuses,
)
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer


# ---------------------------------------------------------------------------------- pause
@pytest.mark.parametrize("n", SEQUENTIAL)
def test_pause_repeated_answers_204_once_then_409_already_paused(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox()

    responses = sequential(http, n, post(f"/sandboxes/{sandbox_id}/pause"))

    assert statuses(responses) == [204] + [409] * (n - 1)
    assert all("already paused" in r.json()["message"] for r in responses[1:])
    assert lc.runtime_state(server, sandbox_id) == "paused"
    assert lc.db_row(server, sandbox_id)[0] == "paused"  # type: ignore[index]


def test_pause_from_two_callers_at_once_answers_one_204_and_one_409(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox()
    for round_ in range(ROUNDS):
        if round_:
            resumed = checked(http.post(f"/v2/sandboxes/{sandbox_id}/connect", json={}))
            assert resumed.status_code == 201
        responses = concurrently(server, post(f"/sandboxes/{sandbox_id}/pause"))
        assert sorted(statuses(responses)) == [204, 409]
        assert lc.runtime_state(server, sandbox_id) == "paused"
        assert lc.db_row(server, sandbox_id)[0] == "paused"  # type: ignore[index]


# ------------------------------------------------------------------------- legacy resume
@pytest.mark.parametrize("n", SEQUENTIAL)
def test_legacy_resume_repeated_answers_201_once_then_409_already_running(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox()
    pause(http, sandbox_id)

    responses = sequential(http, n, post(f"/sandboxes/{sandbox_id}/resume", {"timeout": 600}))

    assert statuses(responses) == [201] + [409] * (n - 1)
    assert responses[0].json()["sandboxID"] == sandbox_id
    assert all("already running" in r.json()["message"] for r in responses[1:])
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]


def test_legacy_resume_from_two_callers_at_once_answers_one_201_and_one_409(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox()
    for _ in range(ROUNDS):
        pause(http, sandbox_id)
        responses = concurrently(server, post(f"/sandboxes/{sandbox_id}/resume", {"timeout": 600}))
        assert sorted(statuses(responses)) == [201, 409]
        assert lc.runtime_state(server, sandbox_id) == "running"
        assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]
