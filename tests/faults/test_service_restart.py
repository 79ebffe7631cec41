"""The whole service killed and started again: gunicorn (master and workers) and the
lifecycle worker SIGKILLed at once, then started afresh on the same database and sandbox
root. Sandboxes run under a launcher of their own, so they outlive the service; the new
one adopts them: none lost, none duplicated, states kept, and new work goes on."""

from __future__ import annotations

import uuid

import pytest
from e2b import Sandbox

from tests.support import live_checks as lc
from tests.support.live_server import LiveServer

RUNNING, PAUSED = 4, 3


def test_a_killed_and_restarted_service_adopts_every_sandbox_in_its_state(
    server: LiveServer,
) -> None:
    tag = f"restart-{uuid.uuid4().hex[:12]}"
    body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
    with lc.client(server) as http:
        made = []
        for _ in range(RUNNING + PAUSED):
            response = http.post("/v2/sandboxes", json=body)
            assert response.status_code == 201, response.text
            made.append(response.json()["sandboxID"])
        for sandbox_id in made[RUNNING:]:
            assert http.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
        listed_before = {k: v for k, v in lc.api_live(http).items() if k in made}
    inits_before = {i.sandbox_id: i.init_pid for i in lc.runtime(server).list()}
    old_pids = (server.process.pid, server.worker.pid)  # type: ignore[union-attr]

    server.restart(crash=True)

    assert (server.process.pid, server.worker.pid) != old_pids  # type: ignore[union-attr]
    expected = {sid: "running" for sid in made[:RUNNING]} | {
        sid: "paused" for sid in made[RUNNING:]
    }
    assert listed_before == expected
    with lc.client(server) as http:
        # Every sandbox is still listed, once, in the state it had.
        assert {k: v for k, v in lc.api_live(http).items() if k in made} == expected
        assert lc.tagged_rows(server, tag) == expected
        # Adopted, not re-created: the same init process still runs each one.
        infos = {i.sandbox_id: i for i in lc.runtime(server).list()}
        assert {sid: str(infos[sid].state) for sid in made} == expected
        assert {sid: infos[sid].init_pid for sid in made} == {
            sid: inits_before[sid] for sid in made
        }
        assert lc.disagreements(server) == []
        # The new service works: a create, a resume of a paused one, kills.
        created = http.post("/v2/sandboxes", json=body)
        assert created.status_code == 201, created.text
        made.append(created.json()["sandboxID"])
        resumed = http.post(f"/v2/sandboxes/{made[RUNNING]}/connect", json={})
        assert resumed.status_code == 201, resumed.text
        assert lc.runtime_state(server, made[RUNNING]) == "running"
        for sandbox_id in made:
            assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 204
        assert lc.tagged_rows(server, tag) == dict.fromkeys(made, "killed")
        assert not set(made) & set(lc.runtime_states(server))


def test_commands_outlive_a_killed_service_and_are_reattached(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # envd lives in the VM; here a command lives in its sandbox (its guest agent), so
    # killing every serving process (API, data plane, worker) loses nothing.
    monkeypatch.setenv("E2B_API_URL", server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", server.sandbox_url)
    monkeypatch.setenv("E2B_API_KEY", server.api_key)
    sbx = Sandbox.create(timeout=600)
    try:
        # Long enough to outlive a restart on a loaded machine (15 s; a restart takes 2-6).
        handle = sbx.commands.run(
            "for i in $(seq 1 150); do echo line$i; sleep 0.1; done", background=True
        )
        first = sbx.commands.run("echo before").stdout
        assert first == "before\n"

        server.restart(crash=True)

        again = Sandbox.connect(sbx.sandbox_id)
        assert handle.pid in {p.pid for p in again.commands.list()}
        result = again.commands.connect(handle.pid).wait()
        assert result.exit_code == 0 and "line150" in result.stdout
        assert again.commands.run("echo after").stdout == "after\n"
    finally:
        sbx.kill()
