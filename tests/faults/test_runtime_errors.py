"""The runtime failing in the middle of an operation (failpoint ``runtime.<op>.before=error``
raises a runtime error before the runtime acts): the caller gets a 503 in E2B's shape, the
state stays consistent in the database and the runtime, and a retry works once the fault is
gone (each point fires once)."""

from __future__ import annotations

import uuid

import httpx

from tests.faults.conftest import Failpoints, create
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer


def unavailable(response: httpx.Response) -> dict[str, object]:
    assert response.status_code == 503, response.text
    return lc.assert_error_shape(response)


def test_pause_failing_in_the_runtime_answers_503_keeps_it_running_and_a_retry_pauses(
    server: LiveServer, http: httpx.Client, failpoints: Failpoints, tag: str
) -> None:
    sandbox_id = create(http, tag)
    failpoints.arm("runtime.pause.before")

    unavailable(http.post(f"/sandboxes/{sandbox_id}/pause"))

    assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]
    assert lc.runtime_state(server, sandbox_id) == "running"
    retried = http.post(f"/sandboxes/{sandbox_id}/pause")
    assert retried.status_code == 204, retried.text
    assert lc.db_row(server, sandbox_id)[0] == "paused"  # type: ignore[index]
    assert lc.runtime_state(server, sandbox_id) == "paused"
    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 204


def test_keyed_create_failing_in_the_runtime_answers_503_and_releases_the_key(
    server: LiveServer, http: httpx.Client, failpoints: Failpoints, tag: str
) -> None:
    key = str(uuid.uuid4())
    body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
    before = set(lc.runtime_states(server))
    failpoints.arm("runtime.create.before")

    unavailable(http.post("/v2/sandboxes", json=body, headers={"Idempotency-Key": key}))

    # Provably nothing allocated: no row, no sandbox, no record holding the key.
    assert lc.tagged_rows(server, tag) == {}
    assert set(lc.runtime_states(server)) == before
    records = lc.query(
        server, "SELECT count(*) FROM idempotency_idempotencyrecord WHERE key = %s", (key,)
    )
    assert records[0][0] == 0
    # So the same key simply creates, as a first attempt (not a replay).
    retried = http.post("/v2/sandboxes", json=body, headers={"Idempotency-Key": key})
    assert retried.status_code == 201, retried.text
    assert "Idempotent-Replayed" not in retried.headers
    sandbox_id = retried.json()["sandboxID"]
    assert lc.tagged_rows(server, tag) == {sandbox_id: "running"}
    assert set(lc.runtime_states(server)) - before == {sandbox_id}
    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 204


def test_kill_failing_in_the_runtime_answers_503_and_a_retry_finishes_the_kill(
    server: LiveServer, http: httpx.Client, failpoints: Failpoints, tag: str
) -> None:
    """The row stays ``killing`` (the runtime may have got part of the way), so the API
    already answers as for a sandbox being killed; the sandbox still runs. A retried DELETE
    re-drives the kill, records it, and is the caller that gets the 204."""
    sandbox_id = create(http, tag)
    failpoints.arm("runtime.kill.before")

    unavailable(http.delete(f"/sandboxes/{sandbox_id}"))

    assert lc.db_row(server, sandbox_id)[0] == "killing"  # type: ignore[index]
    assert lc.runtime_state(server, sandbox_id) == "running"
    connect = http.post(f"/v2/sandboxes/{sandbox_id}/connect", json={})
    assert connect.status_code == 409
    assert "being killed" in lc.assert_error_shape(connect)["message"]

    retried = http.delete(f"/sandboxes/{sandbox_id}")

    assert retried.status_code == 204, retried.text
    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 404
    assert lc.db_row(server, sandbox_id)[0] == "killed"  # type: ignore[index]
    assert lc.runtime_state(server, sandbox_id) is None


def test_kill_failing_in_the_runtime_is_finished_by_the_worker_when_nobody_retries(
    server: LiveServer, http: httpx.Client, failpoints: Failpoints, tag: str
) -> None:
    sandbox_id = create(http, tag)
    failpoints.arm("runtime.kill.before")

    unavailable(http.delete(f"/sandboxes/{sandbox_id}"))
    assert lc.db_row(server, sandbox_id)[0] == "killing"  # type: ignore[index]

    server.run_worker_once("--stale-after", "0")

    assert lc.db_row(server, sandbox_id)[0] == "killed"  # type: ignore[index]
    assert lc.runtime_state(server, sandbox_id) is None
    assert http.get(f"/sandboxes/{sandbox_id}").status_code == 404
