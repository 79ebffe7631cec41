"""The database connection dies after the runtime made the sandbox, before its row says so
(``after_runtime_create=dbdrop``: on PostgreSQL the backend is terminated there). Without a
key the outcome is unknown to the request and nothing will re-drive it: what was made is
removed again and the answer never invites a blind retry (which would make a second
sandbox). With a key the answer says to retry, and the retry completes the one sandbox."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support.live_server import Deployment, Server

pytestmark = pytest.mark.both_databases

BODY = {"templateID": "base", "timeout": 300}


@pytest.fixture(scope="module")
def deployment() -> Iterator[tuple[Deployment, Server]]:
    with Deployment(teams=2, prefix="e2bl") as deployment:
        server = deployment.server(E2BFACADE_FAILPOINTS="after_runtime_create=dbdrop")
        yield deployment, server


def test_an_unkeyed_create_whose_database_died_removes_its_sandbox_and_says_do_not_retry(
    deployment: tuple[Deployment, Server],
) -> None:
    dep, server = deployment
    team = dep.take_team()
    server.arm("after_runtime_create")
    response = httpx.post(
        f"{server.url}/v2/sandboxes", json=BODY, headers={"X-API-Key": team.api_key}, timeout=60
    )
    assert server.fired("after_runtime_create")
    assert response.status_code == 503, response.text
    assert response.headers["Should-Retry"] == "false"
    body = response.json()
    assert body["code"] == 503 and body["error_code"] == "outcome_unknown"
    assert "removed again" in body["message"]
    # Nothing of it runs: the only row the team has is one still "creating" (the database
    # could not be told), which holds no sandbox.
    rows = dep.sandboxes(team)
    assert [state for _, state in rows] == ["creating"]
    assert rows[0][0] not in dep.runtime_ids()
    # The next create works.
    again = httpx.post(
        f"{server.url}/v2/sandboxes", json=BODY, headers={"X-API-Key": team.api_key}, timeout=60
    )
    assert again.status_code == 201, again.text


def test_a_keyed_create_whose_database_died_is_completed_by_its_retry(
    deployment: tuple[Deployment, Server],
) -> None:
    dep, server = deployment
    team = dep.take_team()
    headers = {"X-API-Key": team.api_key, "Idempotency-Key": uuid.uuid4().hex}
    server.arm("after_runtime_create")
    first = httpx.post(f"{server.url}/v2/sandboxes", json=BODY, headers=headers, timeout=60)
    assert server.fired("after_runtime_create")
    assert first.status_code == 503, first.text
    assert first.headers["Should-Retry"] == "true"  # the SDK retries, with the same key
    retry = httpx.post(f"{server.url}/v2/sandboxes", json=BODY, headers=headers, timeout=60)
    assert retry.status_code == 201, retry.text
    sandbox_id = retry.json()["sandboxID"]
    assert dep.sandboxes(team) == [(sandbox_id, "running")]
    assert sandbox_id in dep.runtime_ids()
