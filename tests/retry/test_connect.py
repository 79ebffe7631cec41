"""The retry table's connect rows: ``POST /v2/sandboxes/{id}/connect`` and its v1 twin, on a
running sandbox and on a paused one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import httpx
import pytest

from tests.retry.support import (
    CLOCK_SLACK,
    ROUNDS,
    SEQUENTIAL,
    checked,
    concurrently,
    connect_path,
    end_at,
    now,
    pause,
    post,
    sequential,
    statuses,
)
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer


@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("version", ["v2", "v1"])
def test_connect_to_a_running_sandbox_repeated_answers_200_and_only_extends_the_end_time(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], version: str, n: int
) -> None:
    sandbox_id = new_sandbox(timeout=300)
    previous = end_at(http, sandbox_id)
    for _ in range(n):
        sent = now()
        response = checked(http.post(connect_path(version, sandbox_id), json={"timeout": 600}))
        assert response.status_code == 200, response.text
        assert response.json()["sandboxID"] == sandbox_id
        current = end_at(http, sandbox_id)
        assert current >= previous
        assert current >= sent + timedelta(seconds=600) - CLOCK_SLACK
        previous = current
    # A shorter connect never shortens it.
    response = checked(http.post(connect_path(version, sandbox_id), json={"timeout": 30}))
    assert response.status_code == 200
    assert end_at(http, sandbox_id) == previous
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]


def test_connect_to_a_running_sandbox_from_two_callers_at_once_answers_200_twice(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox(timeout=300)
    previous = end_at(http, sandbox_id)
    for _ in range(ROUNDS):
        sent = now()
        responses = concurrently(
            server, post(f"/v2/sandboxes/{sandbox_id}/connect", {"timeout": 600})
        )
        assert statuses(responses) == [200, 200]
        current = end_at(http, sandbox_id)
        assert current >= previous
        assert current >= sent + timedelta(seconds=600) - CLOCK_SLACK
        previous = current
    assert lc.runtime_state(server, sandbox_id) == "running"


@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("version", ["v2", "v1"])
def test_connect_to_a_paused_sandbox_repeated_resumes_it_once_with_201_then_answers_200(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], version: str, n: int
) -> None:
    sandbox_id = new_sandbox()
    pause(http, sandbox_id)
    assert lc.runtime_state(server, sandbox_id) == "paused"

    responses = sequential(http, n, post(connect_path(version, sandbox_id), {"timeout": 600}))

    assert statuses(responses) == [201] + [200] * (n - 1)
    assert {r.json()["sandboxID"] for r in responses} == {sandbox_id}
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]


def test_connect_to_a_paused_sandbox_from_two_callers_at_once_resumes_it_once(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox()
    for _ in range(ROUNDS):
        pause(http, sandbox_id)
        responses = concurrently(
            server, post(f"/v2/sandboxes/{sandbox_id}/connect", {"timeout": 600})
        )
        assert sorted(statuses(responses)) == [200, 201]
        assert lc.runtime_state(server, sandbox_id) == "running"
        assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]
