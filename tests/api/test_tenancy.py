"""Another team's sandboxes and snapshots do not exist for you: every route answers 404 with
E2B's exact message, the same as for an id nobody has, and nothing is changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.runtime.base import SandboxState
from e2bfacade.runtime.local import LocalRuntime
from sandboxes.models import Sandbox
from templates.models import Template
from tests.api.helpers import NOT_FOUND, assert_error, runtime_state

CreateSandbox = Callable[..., dict[str, Any]]

SANDBOX_ROUTES = [
    ("get", "/sandboxes/{}", None),
    ("delete", "/sandboxes/{}", None),
    ("post", "/sandboxes/{}/pause", {}),
    ("post", "/sandboxes/{}/resume", {"timeout": 60}),
    ("post", "/sandboxes/{}/connect", {"timeout": 60}),
    ("post", "/v2/sandboxes/{}/connect", {"timeout": 60}),
    ("post", "/sandboxes/{}/timeout", {"timeout": 60}),
    ("post", "/sandboxes/{}/refreshes", {"duration": 60}),
    ("get", "/sandboxes/{}/metrics", None),
    ("post", "/sandboxes/{}/snapshots", {"name": "stolen"}),
    ("post", "/sandboxes/{}/fork", {"count": 1}),
]


def call(client: APIClient, method: str, path: str, data: dict[str, Any] | None) -> Any:
    if data is None:
        return getattr(client, method)(path)
    return getattr(client, method)(path, data, format="json")


@pytest.mark.parametrize("paused", [False, True], ids=["running", "paused"])
@pytest.mark.parametrize(("method", "route", "data"), SANDBOX_ROUTES)
def test_another_teams_sandbox_answers_404_and_is_left_alone(
    other_client: APIClient,
    create_sandbox: CreateSandbox,
    api_client: APIClient,
    runtime: LocalRuntime,
    method: str,
    route: str,
    data: dict[str, Any] | None,
    paused: bool,
) -> None:
    sandbox_id = create_sandbox(timeout=600)["sandboxID"]
    if paused:
        assert api_client.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
    before = Sandbox.objects.get(pk=sandbox_id)

    response = call(other_client, method, route.format(sandbox_id), data)

    body = assert_error(response, 404)
    assert body["message"] == NOT_FOUND.format(sandbox_id)
    after = Sandbox.objects.get(pk=sandbox_id)
    assert (after.state, after.end_at) == (before.state, before.end_at)
    expected = SandboxState.PAUSED if paused else SandboxState.RUNNING
    assert runtime_state(runtime, sandbox_id) is expected
    assert not Template.objects.filter(source_sandbox_id=sandbox_id).exists()
    assert Sandbox.objects.count() == 1  # no fork was started


@pytest.mark.parametrize(("method", "route", "data"), SANDBOX_ROUTES)
def test_a_sandbox_nobody_has_answers_the_same_404(
    api_client: APIClient, method: str, route: str, data: dict[str, Any] | None
) -> None:
    response = call(api_client, method, route.format("inobodyhasthisid00000"), data)

    assert assert_error(response, 404)["message"] == NOT_FOUND.format("inobodyhasthisid00000")


def test_another_teams_sandboxes_are_not_listed(
    other_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    create_sandbox()

    assert other_client.get("/v2/sandboxes").json() == []
    assert other_client.get("/sandboxes").json() == []


def test_another_team_can_neither_see_nor_delete_a_snapshot(
    api_client: APIClient, other_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    created = api_client.post(f"/sandboxes/{sandbox_id}/snapshots", {"name": "mine"}, format="json")
    assert created.status_code == 201
    snapshot_id = created.json()["snapshotID"]

    for ref in (snapshot_id, "mine"):
        assert_error(other_client.delete(f"/templates/{ref}"), 404)
        assert_error(other_client.get(f"/templates/{ref}"), 404)
    assert other_client.get("/snapshots").json() == []
    assert other_client.get("/snapshots", {"sandboxID": sandbox_id}).json() == []
    assert other_client.get("/snapshots", {"name": "mine"}).json() == []
    assert_error(
        other_client.post("/v2/sandboxes", {"templateID": snapshot_id}, format="json"), 404
    )

    assert Template.objects.filter(pk=snapshot_id).exists()
    assert [s["snapshotID"] for s in api_client.get("/snapshots").json()] == [snapshot_id]
