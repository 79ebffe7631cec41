"""The retry table's fork row: ``POST /sandboxes/{id}/fork``, with an Idempotency-Key and
without."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.retry.support import (
    ROUNDS,
    SEQUENTIAL,
    concurrently,
    key,
    post,
    record_count,
    replayed,
    runtime_ids,
    sequential,
    statuses,
)
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer


def fork_ids(response: httpx.Response) -> list[str]:
    entries = response.json()
    assert all("sandbox" in e for e in entries), entries
    return [e["sandbox"]["sandboxID"] for e in entries]


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_fork_with_a_key_repeated_replays_the_same_forks(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    kill_later: Callable[[str], str],
    n: int,
) -> None:
    sandbox_id = new_sandbox()
    idempotency_key = key()
    before = runtime_ids(server)

    responses = sequential(
        http,
        n,
        post(f"/sandboxes/{sandbox_id}/fork", {"count": 2, "timeout": 600}, key=idempotency_key),
    )

    assert statuses(responses) == [201] * n
    first = responses[0]
    forks = [kill_later(i) for i in fork_ids(first)]
    assert len(set(forks)) == 2
    assert not replayed(first)
    assert all(replayed(r) and r.content == first.content for r in responses[1:])
    assert runtime_ids(server) - before == set(forks)
    assert all(lc.runtime_state(server, f) == "running" for f in forks)
    assert record_count(server, idempotency_key) == 1


def test_fork_with_a_key_from_two_callers_at_once_makes_one_set_of_forks(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    kill_later: Callable[[str], str],
) -> None:
    sandbox_id = new_sandbox()
    for _ in range(ROUNDS):
        idempotency_key = key()
        before = runtime_ids(server)
        responses = concurrently(
            server,
            post(
                f"/sandboxes/{sandbox_id}/fork", {"count": 2, "timeout": 600}, key=idempotency_key
            ),
        )
        assert statuses(responses) == [201, 201]
        assert responses[0].content == responses[1].content
        assert sorted(replayed(r) for r in responses) == [False, True]
        forks = {kill_later(i) for i in fork_ids(responses[0])}
        assert len(forks) == 2
        assert runtime_ids(server) - before == forks


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_fork_without_a_key_repeated_makes_new_forks_each_time(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    kill_later: Callable[[str], str],
    n: int,
) -> None:
    sandbox_id = new_sandbox()
    before = runtime_ids(server)

    responses = sequential(
        http,
        n,
        post(f"/sandboxes/{sandbox_id}/fork", {"count": 1, "timeout": 600}),
    )

    assert statuses(responses) == [201] * n
    forks = [kill_later(i) for r in responses for i in fork_ids(r)]
    assert len(set(forks)) == n
    assert runtime_ids(server) - before == set(forks)


def test_fork_without_a_key_from_two_callers_at_once_makes_two_forks(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    kill_later: Callable[[str], str],
) -> None:
    sandbox_id = new_sandbox()
    for _ in range(ROUNDS):
        before = runtime_ids(server)
        responses = concurrently(
            server,
            post(f"/sandboxes/{sandbox_id}/fork", {"count": 1, "timeout": 600}),
        )
        assert statuses(responses) == [201, 201]
        forks = {kill_later(i) for r in responses for i in fork_ids(r)}
        assert len(forks) == 2
        assert runtime_ids(server) - before == forks
