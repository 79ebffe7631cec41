"""Admission: a sandbox is created only if its host can hold it and its team may have it
(sandboxes/admission.py). Refusals make nothing, and limits release an Idempotency-Key."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey
from e2bfacade.runtime.local import LocalRuntime
from sandboxes.models import Sandbox
from templates.models import BUILD_DISK_MB, TemplateBuild
from tests.api.helpers import postgres_only, run_at_once
from tests.support.factories import SandboxFactory, TeamFactory, TemplateFactory

pytestmark = pytest.mark.both_databases


def create(client: APIClient, key: str | None = None, **fields: Any) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    body = {"templateID": "base", **fields}
    return client.post("/v2/sandboxes", body, format="json", headers=headers)


def test_a_template_asking_for_more_cpus_than_the_host_has_is_a_400(
    api_client: APIClient, api_key: ApiKey, runtime: LocalRuntime
) -> None:
    TemplateFactory.create(
        team=api_key.team, alias="huge", image_id="base", cpu_count=(os.cpu_count() or 1) + 1
    )
    response = create(api_client, templateID="huge")
    assert response.status_code == 400, response.json()
    assert "CPUs" in response.json()["message"]
    assert not Sandbox.objects.exists()
    assert runtime.list() == []


def test_a_template_asking_for_a_terabyte_of_memory_is_a_400(
    api_client: APIClient, api_key: ApiKey, runtime: LocalRuntime
) -> None:
    TemplateFactory.create(team=api_key.team, alias="tib", image_id="base", memory_mb=1 << 20)
    response = create(api_client, templateID="tib")
    assert response.status_code == 400 and "memory" in response.json()["message"]
    assert not Sandbox.objects.exists()


def test_a_team_at_its_limit_gets_429_and_its_key_is_released(
    api_client: APIClient, runtime: LocalRuntime, settings: Any
) -> None:
    settings.SANDBOX_MAX_CONCURRENT_PER_TEAM = 2
    first = [create(api_client).json()["sandboxID"] for _ in range(2)]
    refused = create(api_client, key="over-the-limit")
    assert refused.status_code == 429
    body = refused.json()
    assert body["code"] == 429 and "maximum number of concurrent sandboxes (2)" in body["message"]
    assert refused["Retry-After"] == "5"
    assert Sandbox.objects.exclude(state="killed").count() == 2
    # A limit is not an answer: once a sandbox is gone, the same key creates.
    assert api_client.delete(f"/sandboxes/{first[0]}").status_code == 204
    again = create(api_client, key="over-the-limit")
    assert again.status_code == 201 and "Idempotent-Replayed" not in again


def test_a_host_at_memory_capacity_gets_503_with_retry_after(
    api_client: APIClient, runtime: LocalRuntime, settings: Any
) -> None:
    # Admit what a 512 MiB sandbox and a half take of this host: the second is refused.
    settings.SANDBOX_MEMORY_OVERCOMMIT = 768 / runtime.capacity().memory_mb
    assert create(api_client).status_code == 201
    refused = create(api_client)
    assert refused.status_code == 503, refused.json()
    assert "at capacity" in refused.json()["message"] and refused["Retry-After"] == "5"
    assert Sandbox.objects.exclude(state="killed").count() == 1
    assert len(runtime.list()) == 1


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_admit_exactly_the_teams_limit(
    api_key: ApiKey, runtime: LocalRuntime, settings: Any
) -> None:
    settings.SANDBOX_MAX_CONCURRENT_PER_TEAM = 3

    def one(i: int) -> int:
        client = APIClient()
        client.credentials(HTTP_X_API_KEY=api_key.raw)  # type: ignore[attr-defined]
        return int(create(client).status_code)

    statuses = Counter(run_at_once(8, one))
    assert statuses == {201: 3, 429: 5}
    assert Sandbox.objects.exclude(state="killed").count() == 3
    assert len(runtime.list()) == 3


@pytest.mark.parametrize(
    ("driver", "memory", "disk"),
    [
        # A freeze keeps memory in RAM: the paused sandbox holds its memory, not more disk.
        ("local", 512 + 512, 1024 * 3),
        # A checkpoint moves it to disk: no RAM held, its memory counted as disk instead.
        ("gvisor", 512, 1024 * 3 + 512),
    ],
)
def test_a_sandbox_paused_with_memory_holds_ram_on_local_and_disk_on_gvisor(
    settings: Any, driver: str, memory: int, disk: int
) -> None:
    from sandboxes.admission import _usage

    settings.SANDBOX_RUNTIME = driver
    team = TeamFactory.create()
    host = "this-host"
    SandboxFactory(team=team, host=host)  # running
    SandboxFactory(team=team, host=host, state="paused", pause_mode="full")
    SandboxFactory(team=team, host=host, state="paused", pause_mode="filesystem")
    assert _usage(team.pk, host)[1:3] == (memory, disk)


def test_the_template_builds_a_host_runs_hold_its_memory_and_disk(api_client: APIClient) -> None:
    """A build's sandbox has no sandboxes row but takes the host's memory and disk all the
    same: a build being run counts, one waiting or another host's does not."""
    from sandboxes.admission import _disk_usage, _usage

    team = TeamFactory.create()
    template = TemplateFactory.create(team=team, image_id="")
    host = "this-host"
    SandboxFactory(team=team, host=host, memory_mb=512, disk_size_mb=1024)
    before = _usage(team.pk, host)
    for status, owner, where in (
        ("building", "worker-1", host),  # run here: counts
        ("building", "", host),  # triggered, not yet claimed: no sandbox yet
        ("waiting", "", host),
        ("building", "worker-2", "another-host"),
    ):
        TemplateBuild.objects.create(
            template=template,
            team=team,
            status=status,
            lease_owner=owner,
            host=where,
            memory_mb=2048,
        )
    after = _usage(team.pk, host)
    assert after[0] == before[0]  # builds are not the team's sandboxes
    assert after[1] - before[1] == 2048
    assert after[2] - before[2] == BUILD_DISK_MB
    assert _disk_usage(host)[0] - _disk_usage("nowhere")[0] == 1024 + BUILD_DISK_MB
