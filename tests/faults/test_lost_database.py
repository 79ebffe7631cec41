"""The database connection dies after the runtime made the sandbox, before its row says so
(``after_runtime_create=dbdrop``: on PostgreSQL the backend is terminated there). Without a
key the outcome is unknown to the request and nothing will re-drive it: what was made is
removed again and the answer never invites a blind retry (which would make a second
sandbox). With a key the answer says to retry, and the retry completes the one sandbox.
On the package's failpoint server (conftest.py): the point is armed for one create."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.faults.conftest import Failpoints
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer

pytestmark = pytest.mark.both_databases

POINT = "after_runtime_create"


def body(tag: str) -> dict[str, object]:
    return {"templateID": "base", "timeout": 300, "metadata": {"tag": tag}}


def test_an_unkeyed_create_whose_database_died_removes_its_sandbox_and_says_do_not_retry(
    server: LiveServer, http: httpx.Client, failpoints: Failpoints, tag: str
) -> None:
    failpoints.arm(POINT)
    response = http.post("/v2/sandboxes", json=body(tag), timeout=60)
    assert failpoints.fired(POINT)
    assert response.status_code == 503, response.text
    assert response.headers["Should-Retry"] == "false"
    answer = response.json()
    assert answer["code"] == 503 and answer["error_code"] == "outcome_unknown"
    assert "removed again" in answer["message"]
    # Nothing of it runs: the only row of the request is one still "creating" (the
    # database could not be told), which holds no sandbox.
    rows = lc.tagged_rows(server, tag)
    assert list(rows.values()) == ["creating"]
    assert next(iter(rows)) not in lc.runtime_states(server)
    # The next create works.
    again = http.post("/v2/sandboxes", json=body(tag), timeout=60)
    assert again.status_code == 201, again.text
    assert http.delete(f"/sandboxes/{again.json()['sandboxID']}").status_code == 204


def test_a_keyed_create_whose_database_died_is_completed_by_its_retry(
    server: LiveServer, http: httpx.Client, failpoints: Failpoints, tag: str
) -> None:
    headers = {"Idempotency-Key": uuid.uuid4().hex}
    failpoints.arm(POINT)
    first = http.post("/v2/sandboxes", json=body(tag), headers=headers, timeout=60)
    assert failpoints.fired(POINT)
    assert first.status_code == 503, first.text
    assert first.headers["Should-Retry"] == "true"  # the SDK retries, with the same key
    retry = http.post("/v2/sandboxes", json=body(tag), headers=headers, timeout=60)
    assert retry.status_code == 201, retry.text
    sandbox_id = retry.json()["sandboxID"]
    assert lc.tagged_rows(server, tag) == {sandbox_id: "running"}
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 204
