"""Two hosts on one database (each its own sandbox root, runtime and lifecycle worker): each
acts on its own sandboxes only. Neither host's reconcile, timeouts or recovery touches the
other's; a call that reaches the wrong host is answered truthfully (never a 204 for a kill
that did not happen); admission counts a host's own sandboxes against its capacity; and a
template build is run by the host that received its trigger and its archives."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from e2bfacade.runtime.local import LocalRuntime
from nodes.selectors import host_label
from tests.contract.template_support import (
    base_spec,
    copy_step,
    request_build,
    run_step,
    tar_of,
    trigger,
    upload,
    wait_build,
)
from tests.support.live_server import Deployment, Server, cleanup_runtime
from tests.support.waiting import eventually, stays


@pytest.fixture
def two_hosts() -> Iterator[tuple[Deployment, Server, Server]]:
    with Deployment(teams=1, prefix="e2bh") as dep:
        root_b = dep.tmp / "root-b"
        a = dep.server(lifecycle_worker=True)
        b = dep.server(lifecycle_worker=True, SANDBOX_ROOT=str(root_b))
        try:
            yield dep, a, b
        finally:
            b.stop()
            cleanup_runtime({**dep.env, "SANDBOX_ROOT": str(root_b)}, root_b)


def call(server: Server, key: str, method: str, path: str, json: object = None) -> httpx.Response:
    return httpx.request(
        method, f"{server.url}{path}", headers={"X-API-Key": key}, timeout=60, json=json
    )


def test_each_host_acts_on_its_own_sandboxes_only(
    two_hosts: tuple[Deployment, Server, Server],
) -> None:
    dep, a, b = two_hosts
    key = dep.take_team().api_key
    body = {"templateID": "base", "timeout": 600}
    on_a = call(a, key, "POST", "/v2/sandboxes", json=body).json()["sandboxID"]
    on_b = call(b, key, "POST", "/v2/sandboxes", json=body).json()["sandboxID"]
    hosts = dict(dep.query("SELECT sandbox_id, host FROM sandboxes_sandbox"))
    assert hosts[on_a] == LocalRuntime(a.sandbox_root).host_id
    assert hosts[on_b] == LocalRuntime(b.sandbox_root).host_id != hosts[on_a]

    for _ in range(2):  # every full tick of both workers: reconcile, timeouts, recovery
        a.run_worker_once()
        b.run_worker_once()
    assert dict(dep.query("SELECT sandbox_id, state FROM sandboxes_sandbox")) == {
        on_a: "running",
        on_b: "running",
    }
    assert {i.sandbox_id for i in LocalRuntime(a.sandbox_root).list()} == {on_a}
    assert {i.sandbox_id for i in LocalRuntime(b.sandbox_root).list()} == {on_b}

    # The wrong host says so, and does nothing; reads work anywhere.
    for method, path in (
        ("DELETE", f"/sandboxes/{on_a}"),
        ("POST", f"/sandboxes/{on_a}/pause"),
        ("POST", f"/sandboxes/{on_a}/snapshots"),
        ("GET", f"/sandboxes/{on_a}/metrics"),
    ):
        wrong = call(b, key, method, path, json={})
        assert wrong.status_code == 503, (method, path, wrong.text)
        assert wrong.json()["error_code"] == "sandbox_on_another_host"
        assert wrong.headers["Should-Retry"] == "false"
        # It names no machine or path of the operator's: an opaque label of the host.
        message = wrong.json()["message"]
        assert f"another host of this service (host {host_label(hosts[on_a])})" in message
        for private in (socket.gethostname(), str(a.sandbox_root), str(b.sandbox_root)):
            assert private not in message, message
    assert call(b, key, "GET", f"/sandboxes/{on_a}").json()["state"] == "running"
    assert str(LocalRuntime(a.sandbox_root).status(on_a).state) == "running"

    assert call(a, key, "DELETE", f"/sandboxes/{on_a}").status_code == 204
    assert call(b, key, "DELETE", f"/sandboxes/{on_b}").status_code == 204


def test_a_build_is_run_by_the_host_that_received_it_never_by_another() -> None:
    with Deployment(teams=1, prefix="e2bh") as dep:
        root_b = dep.tmp / "root-b"
        # Host A answers the API and has no build worker yet; host B's worker is idle.
        a = dep.server(workers=2)
        b = dep.server(workers=2, lifecycle_worker=True, SANDBOX_ROOT=str(root_b))
        try:
            key = dep.take_team().api_key
            with httpx.Client(base_url=a.url, headers={"X-API-Key": key}, timeout=60) as http:
                made = request_build(http, "on-host-a")
                tid, bid = made["templateID"], made["buildID"]
                digest = upload(http, tid, tar_of(("file", "hello.txt", "from host a\n")))
                spec = base_spec(
                    copy_step(digest, "hello.txt", "/srv/"), run_step("cat /srv/hello.txt")
                )
                assert trigger(http, tid, bid, spec).status_code == 202
                # B is woken by the trigger: its worker must leave A's build alone (its
                # archive is on A), not claim it and fail it "never uploaded".
                untouched = [("building", "", LocalRuntime(a.sandbox_root).host_id)]

                def touched() -> list[tuple[object, ...]] | None:
                    row = dep.query(
                        "SELECT status, lease_owner, host FROM templates_templatebuild "
                        "WHERE build_id = %s",
                        (bid,),
                    )
                    return None if row == untouched else row

                stays(touched, for_=5, every=0.2, what="a change to A's waiting build")
                # A's own worker runs it.
                a.lifecycle_worker = True
                a.restart(crash=False)
                info, entries = wait_build(http, tid, bid)
            assert info["status"] == "ready", info
            assert any("from host a" in e["message"] for e in entries)
        finally:
            b.stop()
            cleanup_runtime({**dep.env, "SANDBOX_ROOT": str(root_b)}, root_b)


def test_a_retry_sent_to_another_host_while_the_original_runs_waits_and_replays_its_answer() -> (
    None
):
    # A front spreads a client's retries over the hosts: the retry of a create still running
    # on host A reaches host B, which waits for A's answer and replays it (the record and
    # its owner's lease are the shared database's), never making a second sandbox.
    with Deployment(teams=1, prefix="e2bh") as dep:
        root_b = dep.tmp / "root-b"
        a = dep.server(E2BFACADE_FAILPOINTS="after_runtime_create=sleep:3")
        b = dep.server(SANDBOX_ROOT=str(root_b))
        try:
            key = dep.take_team().api_key
            a.arm("after_runtime_create")
            headers = {"X-API-Key": key, "Idempotency-Key": "one-across-hosts"}
            body = {"templateID": "base", "timeout": 60}
            answers: dict[str, httpx.Response] = {}

            def original() -> None:
                answers["a"] = httpx.post(
                    f"{a.url}/sandboxes", headers=headers, json=body, timeout=60
                )

            thread = threading.Thread(target=original)
            thread.start()
            eventually(
                lambda: a.fired("after_runtime_create"),
                within=60,
                what="the original to reach its stall after the runtime's create",
            )
            answers["b"] = httpx.post(f"{b.url}/sandboxes", headers=headers, json=body, timeout=60)
            thread.join()
            assert answers["a"].status_code == answers["b"].status_code == 201, answers
            assert answers["a"].json()["sandboxID"] == answers["b"].json()["sandboxID"]
            assert dep.query("SELECT count(*) FROM sandboxes_sandbox")[0][0] == 1
            sandbox_id = answers["a"].json()["sandboxID"]
            assert call(a, key, "DELETE", f"/sandboxes/{sandbox_id}").status_code == 204
        finally:
            b.stop()
            cleanup_runtime({**dep.env, "SANDBOX_ROOT": str(root_b)}, root_b)
