"""The retry table's end-time rows: ``POST /sandboxes/{id}/timeout`` (sets the end time, may
shorten it) and ``POST /sandboxes/{id}/refreshes`` (never shortens it)."""

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
    end_at,
    now,
    post,
    statuses,
)
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer


# -------------------------------------------------------------------- timeout, refreshes
@pytest.mark.parametrize("n", SEQUENTIAL)
def test_timeout_repeated_answers_204_and_sets_the_same_end_time_modulo_the_clock(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox(timeout=600)
    original = end_at(http, sandbox_id)
    for _ in range(n):
        sent = now()
        response = checked(http.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 120}))
        answered = now()
        assert response.status_code == 204, response.text
        current = end_at(http, sandbox_id)
        # endAt = now + timeout, whatever it was before: it may shorten.
        assert sent + timedelta(seconds=120) - CLOCK_SLACK <= current
        assert current <= answered + timedelta(seconds=120) + CLOCK_SLACK
        assert current < original
    assert lc.runtime_state(server, sandbox_id) == "running"


def test_timeout_from_two_callers_at_once_answers_204_twice_with_one_end_state(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox(timeout=600)
    for _ in range(ROUNDS):
        sent = now()
        responses = concurrently(server, post(f"/sandboxes/{sandbox_id}/timeout", {"timeout": 120}))
        answered = now()
        assert statuses(responses) == [204, 204]
        current = end_at(http, sandbox_id)
        assert sent + timedelta(seconds=120) - CLOCK_SLACK <= current
        assert current <= answered + timedelta(seconds=120) + CLOCK_SLACK


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_refreshes_repeated_answer_204_and_never_shorten_the_end_time(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox(timeout=60)
    previous = end_at(http, sandbox_id)
    for _ in range(n):
        sent = now()
        response = checked(http.post(f"/sandboxes/{sandbox_id}/refreshes", json={"duration": 600}))
        assert response.status_code == 204, response.text
        current = end_at(http, sandbox_id)
        assert current >= previous
        assert current >= sent + timedelta(seconds=600) - CLOCK_SLACK
        previous = current
    # A short keep-alive (under 15 s counts as 15 s) leaves the later end time alone.
    response = checked(http.post(f"/sandboxes/{sandbox_id}/refreshes", json={"duration": 0}))
    assert response.status_code == 204
    assert end_at(http, sandbox_id) == previous
    assert lc.runtime_state(server, sandbox_id) == "running"


def test_refreshes_from_two_callers_at_once_answer_204_twice_and_never_shorten(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox(timeout=60)
    previous = end_at(http, sandbox_id)
    for _ in range(ROUNDS):
        sent = now()
        responses = concurrently(
            server, post(f"/sandboxes/{sandbox_id}/refreshes", {"duration": 600})
        )
        assert statuses(responses) == [204, 204]
        current = end_at(http, sandbox_id)
        assert current >= previous
        assert current >= sent + timedelta(seconds=600) - CLOCK_SLACK
        previous = current
