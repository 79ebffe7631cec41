"""A gunicorn worker SIGKILLed in the middle of a request, after the runtime acted but
before the database recorded it (failpoint ``runtime.<op>.after``): the client's connection
drops, the row is left in its transitional state, and one ``run_worker --once`` settles it
to what the runtime actually did. Nothing stays stuck, nothing leaks."""

from __future__ import annotations

import httpx
import pytest

from tests.faults.conftest import Failpoints, create
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer


def killed_mid_request(server: LiveServer, method: str, path: str, **kwargs: object) -> None:
    """Send one request on a connection of its own and expect it to drop unanswered."""
    with lc.client(server) as client, pytest.raises(httpx.TransportError):
        client.request(method, path, **kwargs)  # type: ignore[arg-type]


def settle(server: LiveServer) -> None:
    """One worker tick that counts every transitional state as abandoned."""
    server.run_worker_once("--stale-after", "0")


def test_worker_killed_after_the_freeze_leaves_pausing_which_the_worker_settles_to_paused(
    server: LiveServer, http: httpx.Client, failpoints: Failpoints, tag: str
) -> None:
    sandbox_id = create(http, tag)
    failpoints.arm("runtime.pause.after")

    killed_mid_request(server, "POST", f"/sandboxes/{sandbox_id}/pause")

    assert failpoints.fired("runtime.pause.after")
    assert lc.db_row(server, sandbox_id)[0] == "pausing"  # type: ignore[index]
    assert lc.runtime_state(server, sandbox_id) == "paused"
    # Until the worker settles it, a retried pause is told a pause is in flight.
    retried = http.post(f"/sandboxes/{sandbox_id}/pause")
    assert retried.status_code == 409
    assert "being paused" in lc.assert_error_shape(retried)["message"]

    settle(server)

    assert lc.db_row(server, sandbox_id)[0] == "paused"  # type: ignore[index]
    assert lc.runtime_state(server, sandbox_id) == "paused"
    again = http.post(f"/sandboxes/{sandbox_id}/pause")
    assert again.status_code == 409
    assert "already paused" in lc.assert_error_shape(again)["message"]
    resumed = http.post(f"/v2/sandboxes/{sandbox_id}/connect", json={})
    assert resumed.status_code == 201, resumed.text
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 204


def test_worker_killed_after_the_kill_leaves_killing_which_the_worker_settles_to_killed(
    server: LiveServer, http: httpx.Client, failpoints: Failpoints, tag: str
) -> None:
    sandbox_id = create(http, tag)
    failpoints.arm("runtime.kill.after")

    killed_mid_request(server, "DELETE", f"/sandboxes/{sandbox_id}")

    assert failpoints.fired("runtime.kill.after")
    assert lc.db_row(server, sandbox_id)[0] == "killing"  # type: ignore[index]
    assert lc.runtime_state(server, sandbox_id) is None

    settle(server)

    assert lc.db_row(server, sandbox_id)[0] == "killed"  # type: ignore[index]
    assert lc.runtime_state(server, sandbox_id) is None
    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 404
    assert http.get(f"/sandboxes/{sandbox_id}").status_code == 404


def test_worker_killed_after_an_unkeyed_create_leaves_creating_which_the_worker_removes(
    server: LiveServer, http: httpx.Client, failpoints: Failpoints, tag: str
) -> None:
    failpoints.arm("runtime.create.after")

    killed_mid_request(
        server,
        "POST",
        "/v2/sandboxes",
        json={"templateID": "base", "timeout": 600, "metadata": {"tag": tag}},
    )

    assert failpoints.fired("runtime.create.after")
    rows = lc.tagged_rows(server, tag)
    assert list(rows.values()) == ["creating"]
    (sandbox_id,) = rows
    assert lc.runtime_state(server, sandbox_id) == "running"  # made, but handed to nobody
    assert lc.api_live(http).get(sandbox_id) is None  # never listed while creating

    settle(server)

    # No client ever learnt its id, so the worker removes both the row and the sandbox.
    assert lc.tagged_rows(server, tag) == {}
    assert lc.runtime_state(server, sandbox_id) is None
