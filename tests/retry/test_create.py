"""The retry table's create rows: ``POST /v2/sandboxes`` and ``POST /sandboxes``, with an
Idempotency-Key and without."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
import pytest

from tests.retry.support import (
    ROUNDS,
    SEQUENTIAL,
    concurrently,
    key,
    listed_with_tag,
    post,
    record_count,
    replayed,
    runtime_ids,
    sequential,
    statuses,
    tagged_rows,
)
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer

CREATE_ROUTES = ["/v2/sandboxes", "/sandboxes"]


@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("route", CREATE_ROUTES)
def test_create_with_a_key_repeated_replays_the_first_201_and_makes_one_sandbox(
    server: LiveServer,
    http: httpx.Client,
    kill_later: Callable[[str], str],
    tag: str,
    route: str,
    n: int,
) -> None:
    idempotency_key = key()
    body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
    before = runtime_ids(server)

    responses = sequential(http, n, post(route, body, key=idempotency_key))

    assert statuses(responses) == [201] * n
    first = responses[0]
    sandbox_id = kill_later(first.json()["sandboxID"])
    assert not replayed(first)
    assert all(replayed(r) and r.content == first.content for r in responses[1:])
    assert runtime_ids(server) - before == {sandbox_id}
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert tagged_rows(server, tag) == [sandbox_id]
    assert listed_with_tag(http, tag) == [sandbox_id]
    assert record_count(server, idempotency_key) == 1


@pytest.mark.parametrize("route", CREATE_ROUTES)
def test_create_with_a_key_from_two_callers_at_once_makes_one_sandbox_and_one_replay(
    server: LiveServer,
    http: httpx.Client,
    kill_later: Callable[[str], str],
    route: str,
) -> None:
    for _ in range(ROUNDS):
        idempotency_key, tag = key(), f"retry-{uuid.uuid4().hex[:12]}"
        body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
        before = runtime_ids(server)

        responses = concurrently(
            server,
            post(route, body, key=idempotency_key),
        )

        assert statuses(responses) == [201, 201]
        assert responses[0].content == responses[1].content
        assert sorted(replayed(r) for r in responses) == [False, True]
        sandbox_id = kill_later(responses[0].json()["sandboxID"])
        assert runtime_ids(server) - before == {sandbox_id}
        assert tagged_rows(server, tag) == [sandbox_id]
        assert record_count(server, idempotency_key) == 1


@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("route", CREATE_ROUTES)
def test_create_without_a_key_repeated_makes_a_new_sandbox_each_time(
    server: LiveServer,
    http: httpx.Client,
    kill_later: Callable[[str], str],
    tag: str,
    route: str,
    n: int,
) -> None:
    body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
    before = runtime_ids(server)

    responses = sequential(http, n, post(route, body))

    assert statuses(responses) == [201] * n
    ids = [kill_later(r.json()["sandboxID"]) for r in responses]
    assert not any(replayed(r) for r in responses)
    assert len(set(ids)) == n
    assert runtime_ids(server) - before == set(ids)
    assert tagged_rows(server, tag) == sorted(ids)
    assert listed_with_tag(http, tag) == sorted(ids)


def test_create_without_a_key_from_two_callers_at_once_makes_two_sandboxes(
    server: LiveServer, http: httpx.Client, kill_later: Callable[[str], str], tag: str
) -> None:
    body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
    made: list[str] = []
    for _ in range(ROUNDS):
        before = runtime_ids(server)
        responses = concurrently(server, post("/v2/sandboxes", body))
        assert statuses(responses) == [201, 201]
        ids = {kill_later(r.json()["sandboxID"]) for r in responses}
        assert len(ids) == 2
        assert runtime_ids(server) - before == ids
        made += ids
    assert tagged_rows(server, tag) == sorted(made)
