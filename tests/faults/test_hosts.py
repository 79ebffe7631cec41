"""Two hosts on one database (each its own sandbox root, runtime and lifecycle worker): each
acts on its own sandboxes only. Neither host's reconcile, timeouts or recovery touches the
other's; a call that reaches the wrong host is answered truthfully (never a 204 for a kill
that did not happen); and admission counts a host's own sandboxes against its capacity."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from e2bfacade.runtime.local import LocalRuntime
from tests.support.live_server import Deployment, Server, cleanup_runtime


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
    assert call(b, key, "GET", f"/sandboxes/{on_a}").json()["state"] == "running"
    assert str(LocalRuntime(a.sandbox_root).status(on_a).state) == "running"

    assert call(a, key, "DELETE", f"/sandboxes/{on_a}").status_code == 204
    assert call(b, key, "DELETE", f"/sandboxes/{on_b}").status_code == 204
