"""The other routes that honour Idempotency-Key: snapshots and fork. A keyed retry gets the
same snapshot (and the same forks), including after the original died half-way; without a
key every call is a new snapshot, as on E2B."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from e2bfacade.runtime.local import BASE_IMAGE, LocalRuntime
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox
from templates.models import Template
from tests.idempotency.conftest import Crash, PostFn

pytestmark = [pytest.mark.both_databases, pytest.mark.usefixtures("runtime")]
on_postgres = connection.vendor == "postgresql"


@pytest.fixture
def source(post: PostFn) -> str:
    created = post({"templateID": "base", "timeout": 300})
    assert created.status_code == 201
    return str(created.json()["sandboxID"])


def keyed(client: APIClient, path: str, body: dict[str, Any], key: str) -> Any:
    return client.post(path, body, format="json", headers={"Idempotency-Key": key})


def images(runtime: LocalRuntime) -> set[str]:
    return set(runtime.list_images()) - {BASE_IMAGE}


def test_a_keyed_snapshot_retried_is_one_snapshot(
    api_client: APIClient, source: str, key: str, runtime: LocalRuntime
) -> None:
    path = f"/sandboxes/{source}/snapshots"
    first = keyed(api_client, path, {"name": "snap-a"}, key)
    second = keyed(api_client, path, {"name": "snap-a"}, key)

    assert first.status_code == 201, first.content
    assert second.content == first.content
    assert second["Idempotent-Replayed"] == "true"
    assert Template.objects.filter(source_sandbox_id=source).count() == 1
    assert images(runtime) == {Template.objects.get(source_sandbox_id=source).image_id}


def test_unkeyed_snapshots_are_each_a_new_snapshot(
    api_client: APIClient, source: str, runtime: LocalRuntime
) -> None:
    path = f"/sandboxes/{source}/snapshots"
    ids = {api_client.post(path, {}, format="json").json()["snapshotID"] for _ in range(3)}

    assert len(ids) == 3
    assert Template.objects.filter(source_sandbox_id=source).count() == 3


@pytest.mark.parametrize("point", ["after_claim", "before_complete"])
def test_a_keyed_snapshot_whose_owner_died_is_finished_once(
    api_client: APIClient,
    source: str,
    key: str,
    crash_at: Callable[[str], None],
    point: str,
    runtime: LocalRuntime,
) -> None:
    path = f"/sandboxes/{source}/snapshots"
    crash_at(point)
    with pytest.raises(Crash):
        keyed(api_client, path, {}, key)
    record = IdempotencyRecord.objects.get(key=key)
    if not on_postgres:
        IdempotencyRecord.objects.filter(pk=record.pk).update(lease_expires_at=record.created_at)

    retry = keyed(api_client, path, {}, key)

    assert retry.status_code == 201, retry.content
    assert retry.json()["snapshotID"] == record.resource_id
    assert Template.objects.filter(source_sandbox_id=source).count() == 1
    assert len(images(runtime)) == 1


def test_a_keyed_fork_retried_is_one_set_of_forks(
    api_client: APIClient, source: str, key: str, runtime: LocalRuntime
) -> None:
    path = f"/sandboxes/{source}/fork"
    first = keyed(api_client, path, {"count": 2, "timeout": 60}, key)
    second = keyed(api_client, path, {"count": 2, "timeout": 60}, key)

    assert first.status_code == 201, first.content
    assert second.content == first.content
    assert second["Idempotent-Replayed"] == "true"
    fork_ids = {entry["sandbox"]["sandboxID"] for entry in first.json()}
    assert len(fork_ids) == 2
    assert {i.sandbox_id for i in runtime.list()} == fork_ids | {source}
    assert Sandbox.objects.count() == 3


def test_a_keyed_fork_whose_owner_died_after_forking_adopts_its_forks(
    api_client: APIClient,
    source: str,
    key: str,
    crash_at: Callable[[str], None],
    runtime: LocalRuntime,
) -> None:
    path = f"/sandboxes/{source}/fork"
    crash_at("before_complete")
    with pytest.raises(Crash):
        keyed(api_client, path, {"count": 3}, key)
    made = {i.sandbox_id for i in runtime.list()} - {source}
    assert len(made) == 3
    record = IdempotencyRecord.objects.get(key=key)
    if not on_postgres:
        IdempotencyRecord.objects.filter(pk=record.pk).update(lease_expires_at=record.created_at)

    retry = keyed(api_client, path, {"count": 3}, key)

    assert retry.status_code == 201, retry.content
    assert {entry["sandbox"]["sandboxID"] for entry in retry.json()} == made
    assert {i.sandbox_id for i in runtime.list()} == made | {source}
    assert Sandbox.objects.count() == 4
    assert Template.objects.filter(source_sandbox_id=source).count() == 1
