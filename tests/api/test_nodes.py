"""The nodes seam (nodes/selectors.py): every kind of route asks it which host holds a
sandbox or a volume, and a row naming another host is answered there, once, with the 503 the
control plane has always given (``sandbox_on_another_host`` / ``volume_on_another_host``,
``Should-Retry: false``, the host by an opaque label). Admission reads the capacity of the
node the seam places a create on. The two-host case with real servers is
tests/faults/test_hosts.py; here the other host is a row's ``host`` only."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from django.db import connections
from rest_framework.test import APIClient

from e2bfacade.errors import ApiError
from e2bfacade.models import Team
from e2bfacade.runtime.base import Capacity
from e2bfacade.runtime.local import LocalRuntime
from nodes import selectors
from nodes.selectors import Node, host_label, local_node
from sandboxes.models import Sandbox, Volume
from sandboxes.volumes import tokens
from tests.api.helpers import assert_error
from tests.support.factories import SandboxFactory

OTHER = "another-machine:/var/lib/another-root"


@pytest.fixture
def answered_by_seam(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The error codes of every "held elsewhere" answer the seam makes, in order."""
    made: list[str] = []
    original = selectors.elsewhere

    def counting(message: str, *, error_code: str) -> ApiError:
        made.append(error_code)
        return original(message, error_code=error_code)

    monkeypatch.setattr(selectors, "elsewhere", counting)
    return made


def assert_elsewhere(
    body: dict[str, Any], headers: Any, code: str | None, runtime: LocalRuntime
) -> None:
    """``code``: the ``error_code`` the body carries (None: a shape that has none)."""
    if code is not None:
        assert body["error_code"] == code
    assert headers["Should-Retry"] == "false"
    assert f"another host of this service (host {host_label(OTHER)})" in body["message"]
    # The operator's machine names and roots are not the caller's to read.
    for private in (OTHER, runtime.host_id):
        assert private not in body["message"]


CONTROL_ROUTES: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
    ("delete", "/sandboxes/{id}", None),
    ("post", "/sandboxes/{id}/pause", {}),
    ("post", "/sandboxes/{id}/resume", {"timeout": 60}),
    ("post", "/sandboxes/{id}/connect", {"timeout": 60}),
    ("get", "/sandboxes/{id}/metrics", None),
    ("post", "/sandboxes/{id}/snapshots", {}),
)


@pytest.mark.parametrize(("method", "path", "body"), CONTROL_ROUTES)
def test_a_control_route_for_another_hosts_sandbox_gets_the_seams_503(
    api_client: APIClient,
    team: Team,
    runtime: LocalRuntime,
    answered_by_seam: list[str],
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    state = Sandbox.State.PAUSED if "resume" in path else Sandbox.State.RUNNING
    row = SandboxFactory.create(team=team, host=OTHER, state=state)
    call: Callable[..., Any] = getattr(api_client, method)
    response = call(path.format(id=row.sandbox_id), body, format="json")
    error = assert_error(response, 503)
    assert_elsewhere(error, response, "sandbox_on_another_host", runtime)
    assert answered_by_seam == ["sandbox_on_another_host"]
    row.refresh_from_db()
    assert row.state == state  # nothing claimed, nothing done


def test_a_row_without_a_host_is_this_nodes_and_reads_work_for_any_host(
    api_client: APIClient, team: Team, runtime: LocalRuntime
) -> None:
    here = local_node()
    assert here == Node(runtime.host_id)
    assert selectors.node_named("", local=here) == here
    assert selectors.node_named(runtime.host_id, local=here) == here
    assert selectors.node_named(OTHER, local=here) == Node(OTHER) != here
    assert selectors.runtime_for(here) is selectors.local_runtime()
    with pytest.raises(LookupError):
        selectors.runtime_for(Node(OTHER))
    # A read is answered from the database, wherever the sandbox runs.
    row = SandboxFactory.create(team=team, host=OTHER)
    assert api_client.get(f"/sandboxes/{row.sandbox_id}").status_code == 200


def _dataplane(method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    from sandboxes.dataplane.app import application

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://dataplane") as c:
            return await c.request(method, path, headers=headers, timeout=30)

    return asyncio.run(send())


@pytest.fixture
def dataplane_db(monkeypatch: pytest.MonkeyPatch) -> None:
    """The data plane reads rows on its own threads: each closes its connection after the
    read, so none outlives the test database."""
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 0)


@pytest.mark.django_db(transaction=True)
def test_the_data_plane_answers_the_seams_503_for_another_hosts_sandbox(
    team: Team, runtime: LocalRuntime, answered_by_seam: list[str], dataplane_db: None
) -> None:
    row = SandboxFactory.create(team=team, host=OTHER)
    response = _dataplane(
        "POST",
        "/process.Process/List",
        {
            "E2b-Sandbox-Id": row.sandbox_id,
            "Authorization": "Basic " + base64.b64encode(b"user:").decode(),
            "Content-Type": "application/json",
        },
    )
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["sandboxId"] == row.sandbox_id and body["code"] == 503
    assert_elsewhere(body, response.headers, "sandbox_on_another_host", runtime)
    assert answered_by_seam == ["sandbox_on_another_host"]

    # One this host never had, or a killed one, is still "not found" (no answer of the seam).
    Sandbox.objects.filter(pk=row.pk).update(state=Sandbox.State.KILLED)
    for sandbox_id in (row.sandbox_id, "never-made-anywhere"):
        gone = _dataplane("GET", "/health", {"E2b-Sandbox-Id": sandbox_id})
        assert gone.status_code == 502, gone.text
    assert answered_by_seam == ["sandbox_on_another_host"]


@pytest.mark.django_db(transaction=True)
def test_the_volume_content_api_answers_the_seams_503_for_another_hosts_volume(
    team: Team, runtime: LocalRuntime, answered_by_seam: list[str], dataplane_db: None
) -> None:
    volume = Volume.objects.create(
        team=team, name="elsewhere", size_mb=64, host=OTHER, state=Volume.State.READY
    )
    token = tokens.mint(volume.volume_id, volume.token_epoch)
    path = f"/volumecontent/{volume.volume_id}/path?path=/"
    response = _dataplane("GET", path, {"Authorization": f"Bearer {token}"})
    assert response.status_code == 503, response.text
    # E2B's volume content API's error shape: a code (a string) and a message.
    assert response.json()["code"] == "503"
    assert_elsewhere(response.json(), response.headers, None, runtime)
    assert answered_by_seam == ["volume_on_another_host"]


def test_a_volume_route_for_another_hosts_volume_gets_the_seams_503(
    api_client: APIClient, team: Team, runtime: LocalRuntime, answered_by_seam: list[str]
) -> None:
    volume = Volume.objects.create(
        team=team, name="stored-elsewhere", size_mb=64, host=OTHER, state=Volume.State.READY
    )
    response = api_client.delete(f"/volumes/{volume.volume_id}")
    assert_elsewhere(assert_error(response, 503), response, "volume_on_another_host", runtime)
    assert answered_by_seam == ["volume_on_another_host"]
    assert Volume.objects.filter(pk=volume.pk, state=Volume.State.READY).exists()


def test_admission_reads_the_capacity_of_the_node_the_seam_places_on(
    api_client: APIClient, runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    asked: list[Node] = []

    def small(node: Node) -> Capacity:
        asked.append(node)
        return Capacity(cpus=64, memory_mb=1 << 20, pids=100_000, disk_mb=1 << 20)

    monkeypatch.setattr(selectors, "node_capacity", small)
    # One sandbox of any template fits such a node, but all of them together may hold
    # 100 MiB only (exactly: the ratio is a power of two's multiple).
    overcommit = settings.SANDBOX_MEMORY_OVERCOMMIT
    settings.SANDBOX_MEMORY_OVERCOMMIT = 100 / (1 << 20)
    response = api_client.post("/v2/sandboxes", {"templateID": "base"}, format="json")
    body = assert_error(response, 503)
    assert "over the 100 MiB it admits" in body["message"], body
    assert asked and set(asked) == {Node(runtime.host_id)}
    assert not Sandbox.objects.exists()

    # The same create, the node's own capacity read: admitted, on the node placed.
    monkeypatch.undo()
    settings.SANDBOX_MEMORY_OVERCOMMIT = overcommit
    made = api_client.post("/v2/sandboxes", {"templateID": "base"}, format="json")
    assert made.status_code == 201, made.content
    sandbox_id = made.json()["sandboxID"]
    assert Sandbox.objects.get(pk=sandbox_id).host == runtime.host_id
    assert api_client.delete(f"/sandboxes/{sandbox_id}").status_code == 204


def test_a_volume_create_is_admitted_against_the_placed_nodes_capacity(
    api_client: APIClient, runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Node] = []

    def no_disk(node: Node) -> Capacity:
        asked.append(node)
        return Capacity(cpus=64, memory_mb=1 << 20, pids=100_000, disk_mb=1)

    monkeypatch.setattr(selectors, "node_capacity", no_disk)
    response = api_client.post("/volumes", {"name": f"v{uuid.uuid4().hex[:8]}"}, format="json")
    if response.status_code == 403:
        pytest.skip("this host's runtime has no volumes")
    body = assert_error(response, 400)
    assert body["error_code"] == "volume_host_full"
    assert set(asked) == {Node(runtime.host_id)}
