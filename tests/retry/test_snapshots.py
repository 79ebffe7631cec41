"""The retry table's snapshot row: ``POST /sandboxes/{id}/snapshots``, with an
Idempotency-Key and without."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.retry.support import (
    ROUNDS,
    SEQUENTIAL,
    checked,
    concurrently,
    key,
    post,
    record_count,
    replayed,
    sequential,
    statuses,
)
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer


def snapshot_ids_of(http: httpx.Client, sandbox_id: str) -> list[str]:
    response = checked(http.get("/snapshots", params={"sandboxID": sandbox_id}))
    assert response.status_code == 200, response.text
    return sorted(s["snapshotID"] for s in response.json())


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_snapshot_with_a_key_repeated_replays_the_first_201_and_takes_one_snapshot(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    delete_template_later: Callable[[str], str],
    n: int,
) -> None:
    sandbox_id = new_sandbox()
    idempotency_key = key()
    images_before = lc.runtime_images(server)

    responses = sequential(
        http,
        n,
        post(f"/sandboxes/{sandbox_id}/snapshots", {}, key=idempotency_key),
    )

    assert statuses(responses) == [201] * n
    first = responses[0]
    snapshot_id = delete_template_later(first.json()["snapshotID"])
    assert not replayed(first)
    assert all(replayed(r) and r.content == first.content for r in responses[1:])
    assert snapshot_ids_of(http, sandbox_id) == [snapshot_id]
    assert lc.runtime_images(server) - images_before == {snapshot_id}
    assert lc.runtime_state(server, sandbox_id) == "running"  # the source keeps running
    assert record_count(server, idempotency_key) == 1


def test_snapshot_with_a_key_from_two_callers_at_once_takes_one_snapshot(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    delete_template_later: Callable[[str], str],
) -> None:
    sandbox_id = new_sandbox()
    taken: list[str] = []
    for _ in range(ROUNDS):
        idempotency_key = key()
        images_before = lc.runtime_images(server)
        responses = concurrently(
            server,
            post(f"/sandboxes/{sandbox_id}/snapshots", {}, key=idempotency_key),
        )
        assert statuses(responses) == [201, 201]
        assert responses[0].content == responses[1].content
        assert sorted(replayed(r) for r in responses) == [False, True]
        snapshot_id = delete_template_later(responses[0].json()["snapshotID"])
        assert lc.runtime_images(server) - images_before == {snapshot_id}
        taken.append(snapshot_id)
    assert snapshot_ids_of(http, sandbox_id) == sorted(taken)


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_snapshot_without_a_key_repeated_takes_a_new_snapshot_each_time(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    delete_template_later: Callable[[str], str],
    n: int,
) -> None:
    sandbox_id = new_sandbox()
    images_before = lc.runtime_images(server)

    responses = sequential(http, n, post(f"/sandboxes/{sandbox_id}/snapshots", {}))

    assert statuses(responses) == [201] * n
    ids = [delete_template_later(r.json()["snapshotID"]) for r in responses]
    assert len(set(ids)) == n
    assert snapshot_ids_of(http, sandbox_id) == sorted(ids)
    assert lc.runtime_images(server) - images_before == set(ids)
    assert lc.runtime_state(server, sandbox_id) == "running"


def test_snapshot_without_a_key_from_two_callers_at_once_takes_two_snapshots(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    delete_template_later: Callable[[str], str],
) -> None:
    sandbox_id = new_sandbox()
    taken: list[str] = []
    for _ in range(ROUNDS):
        responses = concurrently(server, post(f"/sandboxes/{sandbox_id}/snapshots", {}))
        assert statuses(responses) == [201, 201]
        ids = {delete_template_later(r.json()["snapshotID"]) for r in responses}
        assert len(ids) == 2
        taken += ids
    assert snapshot_ids_of(http, sandbox_id) == sorted(taken)
