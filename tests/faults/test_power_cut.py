"""A power cut: every process of the service and of its runtime SIGKILLed at once (gunicorn,
the data plane, the lifecycle worker, the launcher daemon and its keeper, every sandbox's
init and agent) and, as after a reboot, no sandbox disk mounted. The service started again
on the same database and sandbox root loses no file: a running sandbox and one paused with
its memory come back paused with their files, with the reason; one paused filesystem-only
stays so; each resumes with ``connect`` (the same id, the same envd access token, its
files), and nothing is deleted but by a kill."""

from __future__ import annotations

import pytest
from e2b import Sandbox

from tests.support.live_checks import sandbox_detail
from tests.support.live_server import Deployment, Server
from tests.support.runtime_support import power_cut

MARKERS = {"running": "r", "frozen": "f", "filesystem": "s"}


def three_kinds(
    server: Server, api_key: str, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Sandbox]:
    """A sandbox of each kind the cut meets, each with its marker file synced to disk: one
    running, one paused with its memory (frozen), one paused with its files only."""
    monkeypatch.setenv("E2B_API_URL", server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", server.sandbox_url)
    monkeypatch.setenv("E2B_API_KEY", api_key)
    made: dict[str, Sandbox] = {}
    for name, marker in MARKERS.items():
        sbx = Sandbox.create(timeout=600)
        sbx.files.write("/home/user/marker.txt", marker)
        sbx.commands.run("sync")
        made[name] = sbx
    assert made["frozen"].pause()
    assert made["filesystem"].pause(keep_memory=False)
    return made


def test_a_power_cut_loses_no_sandbox_and_each_resumes_with_its_files(
    cut_deployment: tuple[Deployment, Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    dep, server = cut_deployment
    api_key = dep.take_team().api_key
    made = three_kinds(server, api_key, monkeypatch)
    tokens = {
        name: sandbox_detail(server.url, api_key, s.sandbox_id)["envdAccessToken"]
        for name, s in made.items()
    }

    server.kill()
    power_cut(server.sandbox_root)
    server.start()
    server.run_worker_once()  # one reconcile now, rather than waiting for the worker's

    for name, sbx in made.items():
        info = sandbox_detail(server.url, api_key, sbx.sandbox_id)
        assert (info["state"], info["pauseMode"]) == ("paused", "filesystem"), (name, info)
        if name == "filesystem":
            assert info["pauseReason"] is None  # paused as asked
        else:
            assert "unexpectedly" in str(info["pauseReason"]), info
        assert info["envdAccessToken"] == tokens[name]
    for name, sbx in made.items():
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert resumed.sandbox_id == sbx.sandbox_id
        assert resumed.files.read("/home/user/marker.txt") == MARKERS[name]
        assert resumed.commands.run("echo alive").stdout == "alive\n"
        info = sandbox_detail(server.url, api_key, sbx.sandbox_id)
        assert info["state"] == "running" and info["pauseReason"] is None
    for sbx in made.values():
        assert Sandbox.kill(sbx.sandbox_id) is True
    assert dep.runtime_ids() == set()


@pytest.mark.parametrize("one_by_one", [False, True], ids=["power-cut", "kill-9-each"])
def test_a_client_that_reconnects_right_after_a_power_cut_gets_its_sandbox_back(
    cut_deployment: tuple[Deployment, Server], monkeypatch: pytest.MonkeyPatch, one_by_one: bool
) -> None:
    """Clients reconnect as soon as the service answers, before any reconcile has run:
    every kind of sandbox is resumed from its disk by the connect itself (201, then every
    data-plane call works), never a 201 for a sandbox that is not running, never a 500."""
    dep, server = cut_deployment
    api_key = dep.take_team().api_key
    made = three_kinds(server, api_key, monkeypatch)

    server.kill()
    power_cut(server.sandbox_root, one_by_one=one_by_one)
    server.start()  # no reconcile first: the connect is the first to meet each sandbox

    for name in ("frozen", "running", "filesystem"):
        resumed = Sandbox.connect(made[name].sandbox_id, timeout=600)
        assert resumed.files.read("/home/user/marker.txt") == MARKERS[name], name
        assert resumed.commands.run("echo alive").stdout == "alive\n", name
        info = sandbox_detail(server.url, api_key, resumed.sandbox_id)
        assert info["state"] == "running", (name, info)
    for sbx in made.values():
        assert Sandbox.kill(sbx.sandbox_id) is True
    assert dep.runtime_ids() == set()
