"""E2B's operator routes, for the admin token only (``X-Admin-Token``; the team is the
path's ``teamID``): kill a team's sandboxes, count running sandboxes per team, cancel a
team's builds. They live under ``/admin/…`` beside Django's admin site, and neither shadows
the other. Sandboxes run on the real local runtime."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import resolve, reverse
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team
from e2bfacade.runtime.local import LocalRuntime
from sandboxes.models import Sandbox
from templates.builds import services as builds
from templates.models import BuildStatus, TemplateBuild
from tests.support.factories import ApiKeyFactory, TeamFactory
from tests.support.runtime_support import django_runtime, session_sandbox_root

ADMIN_TOKEN = secrets.token_hex(24)
E2B_ADMIN_PATHS = [
    ("post", "/admin/teams/{team}/sandboxes/kill"),
    ("get", "/admin/sandboxes/running-counts"),
    ("post", "/admin/teams/{team}/builds/cancel"),
    ("post", "/admin/teams/{team}/api-keys"),
    ("delete", "/admin/teams/{team}/api-keys/00000000-0000-0000-0000-000000000000"),
]


@pytest.fixture(scope="session")
def sandbox_root() -> Iterator[Path]:
    yield from session_sandbox_root("e2bo-")


@pytest.fixture
def runtime(settings: Any, sandbox_root: Path, db: None) -> Iterator[LocalRuntime]:
    yield from django_runtime(settings, sandbox_root)


@pytest.fixture(autouse=True)
def operator(settings: Any) -> APIClient:
    settings.E2BFACADE_ADMIN_TOKEN = ADMIN_TOKEN
    client = APIClient()
    client.credentials(HTTP_X_ADMIN_TOKEN=ADMIN_TOKEN)
    return client


def started(client: APIClient, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        response = client.post("/v2/sandboxes", {"templateID": "base"}, format="json")
        assert response.status_code == 201, response.content
        ids.append(response.json()["sandboxID"])
    return ids


def test_the_operator_kills_every_sandbox_of_one_team_and_counts_running_ones(
    runtime: LocalRuntime, operator: APIClient, api_client: APIClient, team: Team
) -> None:
    other: ApiKey = ApiKeyFactory.create(team=TeamFactory.create())
    other_client = APIClient()
    other_client.credentials(HTTP_X_API_KEY=other.raw)  # type: ignore[attr-defined]
    mine = started(api_client, 2)
    theirs = started(other_client, 1)

    counts = operator.get("/admin/sandboxes/running-counts")
    killed = operator.post(f"/admin/teams/{team.pk}/sandboxes/kill")
    again = operator.post(f"/admin/teams/{team.pk}/sandboxes/kill")

    assert counts.status_code == 200, counts.content
    assert counts.json() == {str(team.pk): 2, str(other.team_id): 1}
    assert killed.status_code == 200, killed.content
    assert killed.json() == {"killedCount": 2, "failedCount": 0}
    assert again.json() == {"killedCount": 0, "failedCount": 0}
    states = dict(Sandbox.objects.values_list("sandbox_id", "state"))
    assert [states[s] for s in mine] == ["killed", "killed"]
    assert [states[s] for s in theirs] == ["running"]
    assert runtime.live_ids() & {*mine, *theirs} == set(theirs)
    after = operator.get("/admin/sandboxes/running-counts").json()
    assert after == {str(other.team_id): 1}


def test_the_operator_cancels_a_teams_waiting_and_building_builds(
    operator: APIClient, team: Team
) -> None:
    other = TeamFactory.create()
    body = builds.build_request_body({"name": "t"})
    waiting = builds.build_request(team=team, body=body).build
    building = builds.build_request(team=team, body=builds.build_request_body({"name": "u"})).build
    TemplateBuild.objects.filter(pk=building.pk).update(status=BuildStatus.BUILDING)
    theirs = builds.build_request(team=other, body=body).build

    response = operator.post(f"/admin/teams/{team.pk}/builds/cancel")

    assert response.status_code == 200, response.content
    assert response.json() == {"cancelledCount": 2, "failedCount": 0}
    for build in (waiting, building):
        build.refresh_from_db()
        assert build.status == BuildStatus.ERROR
        assert build.reason == {"message": builds.CANCELED_BY_OPERATOR}
    theirs.refresh_from_db()
    assert theirs.status == BuildStatus.WAITING


@pytest.mark.parametrize(("method", "path"), E2B_ADMIN_PATHS)
def test_operator_routes_refuse_an_api_key_and_a_wrong_token_and_404_an_unknown_team(
    api_client: APIClient, operator: APIClient, team: Team, method: str, path: str
) -> None:
    with_key = getattr(api_client, method)(path.format(team=team.pk), {}, format="json")
    wrong = getattr(APIClient(), method)(
        path.format(team=team.pk), {}, format="json", HTTP_X_ADMIN_TOKEN="x" * 48
    )

    assert with_key.status_code == 401, with_key.content
    assert with_key.json()["code"] == 401
    assert wrong.status_code == 401 and wrong.json()["message"] == "invalid admin token"
    if "{team}" in path:
        unknown = getattr(operator, method)(path.format(team="424242"), {}, format="json")
        assert unknown.status_code == 404, unknown.content
        assert unknown.json() == {"code": 404, "message": "team '424242' not found"}


def test_e2bs_admin_paths_and_the_admin_site_never_shadow_each_other(team: Team) -> None:
    for _, path in E2B_ADMIN_PATHS:
        match = resolve(path.format(team=team.pk))
        assert "admin" not in match.namespaces, path
    site_urls = [reverse("admin:index"), reverse("admin:login")]
    for model, _ in admin.site._registry.items():
        meta = model._meta
        site_urls += [
            reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"),
            reverse(f"admin:{meta.app_label}_{meta.model_name}_add"),
        ]
    for url in site_urls:
        assert resolve(url).namespaces == ["admin"], url
    assert Client().get("/admin/login/").status_code == 200


def test_nodes_are_this_services_one_host_under_an_opaque_id(
    operator: APIClient, api_client: APIClient, runtime: LocalRuntime
) -> None:
    from nodes.selectors import host_label

    client = api_client
    started(client, 2)
    nodes = operator.get("/nodes")
    assert nodes.status_code == 200, nodes.content
    [node] = nodes.json()
    assert node["id"] == host_label(runtime.host_id)
    assert node["status"] == "ready" and node["sandboxCount"] == 2
    assert node["metrics"]["cpuCount"] == runtime.capacity().cpus
    assert node["metrics"]["allocatedMemoryBytes"] == 2 * 512 << 20
    text = nodes.content.decode()
    assert str(runtime.root) not in text  # no host path in what is answered
    detail = operator.get(f"/nodes/{node['id']}")
    assert detail.status_code == 200 and detail.json()["id"] == node["id"]
    assert operator.get("/nodes/not-a-node").status_code == 404
    # The one host stays ready: other statuses are refused by name, never pretended.
    assert (
        operator.post(f"/nodes/{node['id']}", {"status": "ready"}, format="json").status_code == 204
    )
    drain = operator.post(f"/nodes/{node['id']}", {"status": "draining"}, format="json")
    assert drain.status_code == 400 and "one host" in drain.json()["message"]
    assert operator.post(f"/nodes/{node['id']}", {"status": "x"}, format="json").status_code == 400
    # An API key is not the operator's.
    assert client.get("/nodes").status_code in (401, 403)
