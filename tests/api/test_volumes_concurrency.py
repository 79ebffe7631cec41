"""Volume creates and deletes racing each other on PostgreSQL (real threads, each its own
connection, through the real views and runtime): the team's budget and a volume's name
are never exceeded or doubled, and a delete and a create mounting the volume never both
succeed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey
from e2bfacade.runtime.local import LocalRuntime
from sandboxes.models import Sandbox, SandboxVolumeMount, Volume
from tests.api.helpers import postgres_only, run_at_once
from tests.support.runtime_support import kill_everything

pytestmark = [postgres_only, pytest.mark.django_db(transaction=True)]
CALLERS = 4


@pytest.fixture(autouse=True)
def small_volumes(settings: Any, runtime: LocalRuntime) -> Iterator[None]:
    settings.VOLUME_MAX_MB = 8
    settings.VOLUME_MAX_MB_PER_TEAM = 16
    yield
    kill_everything(runtime)
    for entry in (runtime.root / "volumes").iterdir():
        if not entry.name.startswith("."):
            runtime.delete_volume(entry.name)


def client_of(api_key: ApiKey) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=api_key.raw)  # type: ignore[attr-defined]
    return client


def test_creates_at_once_stop_at_the_teams_budget(api_key: ApiKey) -> None:
    responses = run_at_once(
        CALLERS, lambda i: client_of(api_key).post("/volumes", {"name": f"b{i}"}, format="json")
    )
    assert Counter(r.status_code for r in responses) == {201: 2, 400: CALLERS - 2}
    refused = [r.json() for r in responses if r.status_code == 400]
    assert {body["error_code"] for body in refused} == {"volume_budget_exceeded"}
    assert Volume.objects.filter(state=Volume.State.READY).count() == 2


def test_creates_of_one_name_at_once_make_one_volume(api_key: ApiKey) -> None:
    responses = run_at_once(
        CALLERS, lambda i: client_of(api_key).post("/volumes", {"name": "same"}, format="json")
    )
    assert Counter(r.status_code for r in responses) == {201: 1, 400: CALLERS - 1}
    for r in responses:
        if r.status_code == 400:
            assert r.json()["message"] == "Volume with name 'same' already exists"
    assert Volume.objects.count() == 1


def test_a_delete_and_a_create_mounting_the_volume_never_both_succeed(
    api_key: ApiKey, runtime: LocalRuntime, settings: Any
) -> None:
    settings.VOLUME_MAX_MB_PER_TEAM = 64  # room for every round's volume
    outcomes = []
    for round_ in range(3):
        made = client_of(api_key).post("/volumes", {"name": f"race{round_}"}, format="json")
        assert made.status_code == 201, made.content
        volume_id = made.json()["volumeID"]
        body = {"templateID": "base", "volumeMounts": [{"name": f"race{round_}", "path": "/v"}]}

        def act(i: int, volume_id: str = volume_id, body: dict[str, Any] = body) -> Any:
            client = client_of(api_key)
            if i == 0:
                return client.delete(f"/volumes/{volume_id}")
            return client.post("/v2/sandboxes", body, format="json")

        deleted, created = run_at_once(2, act)
        pair = (deleted.status_code, created.status_code)
        assert pair in {(204, 400), (400, 201)}, (deleted.content, created.content)
        if pair == (400, 201):
            assert deleted.json()["error_code"] == "volume_in_use"
            sandbox_id = created.json()["sandboxID"]
            assert runtime.volume_users(volume_id) == {sandbox_id}
            assert SandboxVolumeMount.objects.filter(sandbox_id=sandbox_id).count() == 1
        else:
            assert "not found" in created.json()["message"]
            assert not Volume.objects.filter(pk=volume_id).exists()
        outcomes.append(pair)
        kill_everything(runtime)
        Sandbox.objects.all().delete()
    assert len(outcomes) == 3
