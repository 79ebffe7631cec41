"""Volumes against the host: admission counts the host's volumes as allocated disk (a
sandbox create and a volume create alike), and the worker's sweep removes the runtime's
volume storage that no row names (a team's delete cascades to its rows), after a grace,
never one a row or a live sandbox still names. Real views, the real local runtime, the
real database."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils import timezone
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from e2bfacade.models import Team
from e2bfacade.runtime.local import LocalRuntime
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox, Volume
from sandboxes.volumes import services as volume_services
from templates.models import Template
from tests.api.helpers import assert_error
from tests.api.test_volumes import (  # noqa: F401 (small_volumes: an autouse fixture)
    create_volume,
    has_storage,
    new_volume,
    small_volumes,
)

State = Volume.State
ORPHANS = "e2bfacade_volume_orphans_removed_total"


def base_disk_mb() -> int:
    return Template.objects.get(pk="base").disk_size_mb


def admit_disk(settings: Any, runtime: LocalRuntime, mb: float) -> None:
    """Make the host admit ``mb`` MiB of disk (sandboxes' and volumes' together)."""
    settings.SANDBOX_DISK_OVERCOMMIT = mb / runtime.capacity().disk_mb


def create_sandbox_at(client: APIClient, key: str | None = None, **fields: Any) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    body = {"templateID": "base", **fields}
    return client.post("/v2/sandboxes", body, format="json", headers=headers)


# -------------------------------------------------------------------------- admission
def test_a_sandbox_create_is_refused_when_the_hosts_volumes_fill_its_disk(
    api_client: APIClient, runtime: LocalRuntime, settings: Any
) -> None:
    disk = base_disk_mb()
    admit_disk(settings, runtime, disk + 12.5)  # one sandbox and one 8 MB volume, not two
    first = create_sandbox_at(api_client)
    assert first.status_code == 201, first.content
    assert api_client.delete(f"/sandboxes/{first.json()['sandboxID']}").status_code == 204
    made = [new_volume(api_client, f"v{i}") for i in range(2)]  # 16 MB: no sandbox fits
    key = str(uuid.uuid4())
    refused = create_sandbox_at(api_client, key=key)
    body = assert_error(refused, 503)
    assert "at capacity" in body["message"] and "volumes (16 MiB)" in body["message"]
    assert refused["Retry-After"] == "5"
    assert not IdempotencyRecord.objects.exists()  # a limit releases its key
    assert Sandbox.objects.exclude(state="killed").count() == 0
    assert api_client.delete(f"/volumes/{made[0]['volumeID']}").status_code == 204
    again = create_sandbox_at(api_client, key=key)
    assert again.status_code == 201, again.content


def test_a_volume_create_is_refused_when_sandboxes_and_volumes_fill_the_hosts_disk(
    api_client: APIClient, runtime: LocalRuntime, settings: Any, other_team: Team
) -> None:
    disk = base_disk_mb()
    admit_disk(settings, runtime, disk + 12.5)
    sandbox = create_sandbox_at(api_client)
    assert sandbox.status_code == 201, sandbox.content
    fits = new_volume(api_client, "fits")  # the sandbox's disk and 8 MB
    key = str(uuid.uuid4())
    body = assert_error(create_volume(api_client, "over", key=key), 400)
    assert body["error_code"] == "volume_host_full"
    assert f"the live sandboxes' disks hold {disk} MiB and the volumes 8 MiB" in body["message"]
    assert not IdempotencyRecord.objects.exists()  # a limit releases its key
    assert not Volume.objects.filter(name="over").exists()
    assert runtime.volume_ids() == {fits["volumeID"]}
    # A volume being created counts as one made, whichever team's it is (the host's disk is
    # every team's).
    assert api_client.delete(f"/volumes/{fits['volumeID']}").status_code == 204
    Volume.objects.create(
        team=other_team, name="half-made", size_mb=8, state=State.CREATING, host=runtime.host_id
    )
    body = assert_error(create_volume(api_client, "over", key=key), 400)
    assert body["error_code"] == "volume_host_full" and "the volumes 8 MiB" in body["message"]
    # Once the sandbox is gone, the same key creates.
    assert api_client.delete(f"/sandboxes/{sandbox.json()['sandboxID']}").status_code == 204
    assert create_volume(api_client, "over", key=key).status_code == 201


# ------------------------------------------------------------------------------ orphans
def test_the_sweep_removes_orphaned_storage_after_its_grace_and_never_what_is_named_or_mounted(
    api_client: APIClient,
    other_client: APIClient,
    other_team: Team,
    team: Team,
    create_sandbox: Callable[..., dict[str, Any]],
    runtime: LocalRuntime,
) -> None:
    kept = new_volume(api_client, "kept")["volumeID"]
    half = Volume.objects.create(
        team=team, name="half", size_mb=8, state=State.CREATING, host=runtime.host_id
    )
    runtime.create_volume(str(half.pk), 8)  # storage of a create whose row is not ready
    orphan = new_volume(other_client, "orphan")["volumeID"]
    mounted = new_volume(other_client, "mounted")["volumeID"]
    sandbox = create_sandbox(other_client, volumeMounts=[{"name": "mounted", "path": "/mnt/m"}])
    runtime.create_volume("not-the-control-planes", 8)
    other_team.delete()  # cascades to its rows; the runtime's sandbox and storage stay
    assert not Volume.objects.filter(pk__in=[orphan, mounted]).exists()
    every = {kept, str(half.pk), orphan, mounted, "not-the-control-planes"}
    assert runtime.volume_ids() == every
    before = REGISTRY.get_sample_value(ORPHANS) or 0.0

    # Made just now: within the grace, nothing goes.
    assert volume_services.volume_sweep(older_than=timezone.now() - timedelta(minutes=5)) == []
    assert runtime.volume_ids() == every
    assert runtime.volume_ids(made_before=timezone.now().timestamp() - 60) == set()

    later = timezone.now() + timedelta(seconds=1)
    assert volume_services.volume_sweep_orphans(made_before=later) == [orphan]
    assert not has_storage(runtime, orphan)
    assert runtime.volume_ids() == every - {orphan}  # the mounted one waits for its sandbox
    assert REGISTRY.get_sample_value(ORPHANS) == before + 1
    assert Volume.objects.get(pk=kept).state == State.READY

    runtime.kill(sandbox["sandboxID"])
    later = timezone.now() + timedelta(seconds=1)
    volume_services.volume_sweep(
        older_than=timezone.now() - timedelta(minutes=5), orphans_made_before=later
    )
    assert runtime.volume_ids() == {kept, str(half.pk), "not-the-control-planes"}
    assert REGISTRY.get_sample_value(ORPHANS) == before + 2
    runtime.delete_volume("not-the-control-planes")
