"""E2B's volume control API (``/volumes``) and volume mounts at sandbox create, through the
real views, the real local runtime (each volume its own ext4 image) and the real database:
wire codes and shapes, E2B's validation texts, tenancy, tokens, idempotency, the team's
budget, delete while mounted, and crashes between the row and the runtime."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import RestrictedError
from django.utils import timezone
from rest_framework.test import APIClient

from e2bfacade.runtime.base import LimitExceeded
from e2bfacade.runtime.local import LocalRuntime
from e2bfacade.runtime.volumes import VolumeNotFound
from idempotency import claims as idempotency_claims
from idempotency import maintenance
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox, SandboxVolumeMount, Volume
from sandboxes.volumes import services as volume_services
from sandboxes.volumes import tokens
from tests.api.helpers import assert_error
from tests.idempotency.conftest import Crash
from tests.runtime.helpers import run
from tests.support.factories import SandboxFactory
from tests.support.runtime_support import kill_everything

State = Volume.State


@pytest.fixture(autouse=True)
def small_volumes(settings: Any, runtime: LocalRuntime) -> Iterator[None]:
    """Volumes of the runtime's smallest size, a budget of three; every volume the test
    made is removed from the runtime afterwards (its sandboxes killed first)."""
    settings.VOLUME_MAX_MB = 8
    settings.VOLUME_MAX_MB_PER_TEAM = 24
    yield
    kill_everything(runtime)
    for entry in (runtime.root / "volumes").iterdir():
        if not entry.name.startswith("."):
            runtime.delete_volume(entry.name)


def create_volume(client: APIClient, name: str, key: str | None = None) -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post("/volumes", {"name": name}, format="json", headers=headers)


def new_volume(client: APIClient, name: str) -> dict[str, Any]:
    response = create_volume(client, name)
    assert response.status_code == 201, response.content
    return response.json()  # type: ignore[no-any-return]


def arm_crash(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """The next request reaching failpoint ``point`` dies there (once)."""
    fired: list[str] = []

    def failpoint(name: str) -> None:
        if name == point and not fired:
            fired.append(name)
            raise Crash(name)

    monkeypatch.setattr(idempotency_claims, "failpoint", failpoint)
    monkeypatch.setattr(volume_services, "failpoint", failpoint)


def listed_ids(client: APIClient) -> set[str]:
    response = client.get("/volumes")
    assert response.status_code == 200
    return {v["volumeID"] for v in response.json()}


def has_storage(runtime: LocalRuntime, volume_id: str) -> bool:
    try:
        runtime.volume_info(volume_id)
    except VolumeNotFound:
        return False
    return True


# ------------------------------------------------------------------------ create / read
def test_create_answers_201_with_id_name_token_and_this_servers_domain(
    api_client: APIClient, runtime: LocalRuntime, settings: Any
) -> None:
    response = create_volume(api_client, "data_1-x")
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"volumeID", "name", "token", "domain"}
    assert body["name"] == "data_1-x"
    assert body["domain"] == settings.SANDBOX_DOMAIN
    volume = Volume.objects.get(pk=body["volumeID"])
    assert str(volume.volume_id) == body["volumeID"]
    assert volume.state == State.READY
    assert volume.size_mb == 8
    assert volume.host == runtime.host_id
    assert tokens.verify(body["token"], volume.volume_id, volume.token_epoch)
    assert runtime.volume_info(body["volumeID"]).size_mb == 8


@pytest.mark.parametrize("name", ["", "with space", "a/b", "dot.ted", "ünï", "x" * 256])
def test_a_name_outside_e2bs_pattern_is_400_and_records_nothing(
    api_client: APIClient, name: str
) -> None:
    body = assert_error(create_volume(api_client, name, key=str(uuid.uuid4())), 400)
    assert body["message"].startswith("Invalid volume name")
    assert not Volume.objects.exists()
    assert not IdempotencyRecord.objects.exists()


def test_a_missing_or_non_string_name_is_400(api_client: APIClient) -> None:
    assert_error(api_client.post("/volumes", {}, format="json"), 400)
    assert_error(api_client.post("/volumes", {"name": 5}, format="json"), 400)
    assert not Volume.objects.exists()


def test_a_duplicate_name_is_400_with_e2bs_text_but_another_team_may_use_it(
    api_client: APIClient, other_client: APIClient
) -> None:
    new_volume(api_client, "shared")
    body = assert_error(create_volume(api_client, "shared"), 400)
    assert body["message"] == "Volume with name 'shared' already exists"
    new_volume(other_client, "shared")
    assert Volume.objects.filter(name="shared").count() == 2


def test_the_list_holds_the_teams_ready_volumes_only(
    api_client: APIClient, other_client: APIClient, team: Any
) -> None:
    a = new_volume(api_client, "a")
    b = new_volume(api_client, "b")
    new_volume(other_client, "theirs")
    Volume.objects.create(team=team, name="half-made", size_mb=8, state=State.CREATING)
    response = api_client.get("/volumes")
    assert response.status_code == 200
    assert response.json() == [
        {"volumeID": a["volumeID"], "name": "a"},
        {"volumeID": b["volumeID"], "name": "b"},
    ]


def test_get_answers_the_volume_with_a_fresh_token(api_client: APIClient, settings: Any) -> None:
    made = new_volume(api_client, "v")
    settings.VOLUME_TOKEN_SECONDS = 3600
    response = api_client.get(f"/volumes/{made['volumeID']}")
    assert response.status_code == 200
    body = response.json()
    assert {k: body[k] for k in ("volumeID", "name", "domain")} == {
        "volumeID": made["volumeID"],
        "name": "v",
        "domain": settings.SANDBOX_DOMAIN,
    }
    volume = Volume.objects.get(pk=made["volumeID"])
    assert body["token"] != made["token"]  # minted now, with the new lifetime
    assert tokens.verify(body["token"], volume.volume_id, volume.token_epoch)
    # Revoking (the admin's action raises the epoch) voids both.
    Volume.objects.filter(pk=volume.pk).update(token_epoch=volume.token_epoch + 1)
    assert not tokens.verify(body["token"], volume.volume_id, volume.token_epoch + 1)
    assert not tokens.verify(made["token"], volume.volume_id, volume.token_epoch + 1)


def test_get_of_a_non_uuid_is_400_and_of_an_unknown_id_404(api_client: APIClient) -> None:
    body = assert_error(api_client.get("/volumes/not-a-uuid"), 400)
    assert body["message"] == "Invalid volume ID"
    body = assert_error(api_client.get(f"/volumes/{uuid.uuid4()}"), 404)
    assert body["message"] == "Volume not found"
    assert_error(api_client.delete("/volumes/not-a-uuid"), 400)
    assert_error(api_client.delete(f"/volumes/{uuid.uuid4()}"), 404)


def test_another_team_can_neither_get_delete_nor_mount_a_volume(
    api_client: APIClient, other_client: APIClient, runtime: LocalRuntime
) -> None:
    made = new_volume(api_client, "mine")
    assert_error(other_client.get(f"/volumes/{made['volumeID']}"), 404)
    assert_error(other_client.delete(f"/volumes/{made['volumeID']}"), 404)
    assert other_client.get("/volumes").json() == []
    for ref in ("mine", made["volumeID"]):
        response = other_client.post(
            "/v2/sandboxes",
            {"templateID": "base", "volumeMounts": [{"name": ref, "path": "/mnt/data"}]},
            format="json",
        )
        body = assert_error(response, 400)
        assert body["message"] == f"invalid mounts:\n\t- volume mount #0: volume '{ref}' not found"
    assert not Sandbox.objects.exists()
    assert Volume.objects.get(pk=made["volumeID"]).state == State.READY
    assert has_storage(runtime, made["volumeID"])


# ----------------------------------------------------------------------------- delete
def test_delete_answers_204_removes_the_storage_then_404(
    api_client: APIClient, runtime: LocalRuntime
) -> None:
    made = new_volume(api_client, "gone")
    response = api_client.delete(f"/volumes/{made['volumeID']}")
    assert response.status_code == 204, response.content
    assert not Volume.objects.exists()
    assert not has_storage(runtime, made["volumeID"])
    assert_error(api_client.delete(f"/volumes/{made['volumeID']}"), 404)
    new_volume(api_client, "gone")  # the name is free again


def test_delete_is_refused_while_a_live_sandbox_mounts_it_and_allowed_after_its_kill(
    api_client: APIClient, create_sandbox: Callable[..., dict[str, Any]], runtime: LocalRuntime
) -> None:
    made = new_volume(api_client, "busy")
    sandbox = create_sandbox(volumeMounts=[{"name": "busy", "path": "/mnt/data"}])
    sandbox_id = sandbox["sandboxID"]
    body = assert_error(api_client.delete(f"/volumes/{made['volumeID']}"), 400)
    assert body["error_code"] == "volume_in_use" and sandbox_id in body["message"]
    assert Volume.objects.get(pk=made["volumeID"]).state == State.READY
    assert has_storage(runtime, made["volumeID"])
    # Paused still counts.
    assert api_client.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
    assert_error(api_client.delete(f"/volumes/{made['volumeID']}"), 400)
    assert api_client.delete(f"/sandboxes/{sandbox_id}").status_code == 204
    assert api_client.delete(f"/volumes/{made['volumeID']}").status_code == 204
    assert not has_storage(runtime, made["volumeID"])
    assert not SandboxVolumeMount.objects.exists()  # the killed sandbox's record went with it


# ------------------------------------------------------------------------------ budget
def test_a_create_past_the_teams_budget_is_refused_until_a_volume_is_deleted(
    api_client: APIClient, other_client: APIClient
) -> None:
    made = [new_volume(api_client, f"v{i}") for i in range(3)]  # 3 x 8 MB = the 24 MB budget
    body = assert_error(create_volume(api_client, "v3", key=str(uuid.uuid4())), 400)
    assert body["error_code"] == "volume_budget_exceeded"
    assert "24 MB" in body["message"]
    assert not IdempotencyRecord.objects.exists()  # a limit releases its key
    new_volume(other_client, "v3")  # another team's budget is its own
    assert api_client.delete(f"/volumes/{made[0]['volumeID']}").status_code == 204
    new_volume(api_client, "v3")


# -------------------------------------------------------------------------- idempotency
def test_a_keyed_create_replays_the_same_volume_and_a_different_body_is_409(
    api_client: APIClient,
) -> None:
    key = str(uuid.uuid4())
    first = create_volume(api_client, "once", key=key)
    assert first.status_code == 201, first.content
    again = create_volume(api_client, "once", key=key)
    assert again.status_code == 201
    assert again.json() == first.json()
    assert Volume.objects.count() == 1
    body = assert_error(create_volume(api_client, "other", key=key), 409)
    assert body["error_code"] == "idempotency_request_mismatch"
    assert Volume.objects.count() == 1


def test_a_create_that_died_between_its_row_and_the_runtime_is_re_driven_by_its_key(
    api_client: APIClient, monkeypatch: pytest.MonkeyPatch, runtime: LocalRuntime
) -> None:
    for point in ("after_claim", "after_volume_create"):
        key = str(uuid.uuid4())
        arm_crash(monkeypatch, point)
        with pytest.raises(Crash):
            create_volume(api_client, f"crash-{point}", key=key)
        record = IdempotencyRecord.objects.get(key=key)
        volume = Volume.objects.get(pk=record.resource_id)
        assert volume.state == State.CREATING
        assert has_storage(runtime, record.resource_id) == (point == "after_volume_create")
        # Not visible while half-made.
        assert record.resource_id not in listed_ids(api_client)
        assert_error(api_client.get(f"/volumes/{record.resource_id}"), 404)
        IdempotencyRecord.objects.filter(pk=record.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        retry = create_volume(api_client, f"crash-{point}", key=key)
        assert retry.status_code == 201, retry.content
        assert retry.json()["volumeID"] == record.resource_id
        assert Volume.objects.get(pk=record.resource_id).state == State.READY
        assert has_storage(runtime, record.resource_id)
    assert Volume.objects.count() == 2


def test_the_sweep_removes_an_unkeyed_create_that_died_and_leaves_a_keyed_one(
    api_client: APIClient, monkeypatch: pytest.MonkeyPatch, runtime: LocalRuntime
) -> None:
    arm_crash(monkeypatch, "after_volume_create")
    with pytest.raises(Crash):
        create_volume(api_client, "orphan")
    orphan = Volume.objects.get(name="orphan")
    assert orphan.state == State.CREATING and has_storage(runtime, str(orphan.pk))
    arm_crash(monkeypatch, "after_volume_create")
    with pytest.raises(Crash):
        create_volume(api_client, "keyed", key=str(uuid.uuid4()))
    keyed = Volume.objects.get(name="keyed")
    # Not yet stale: left alone.
    assert volume_services.volume_sweep(older_than=timezone.now() - timedelta(minutes=5)) == []
    removed = volume_services.volume_sweep(older_than=timezone.now() + timedelta(seconds=1))
    assert removed == [str(orphan.pk)]
    assert not Volume.objects.filter(pk=orphan.pk).exists()
    assert not has_storage(runtime, str(orphan.pk))
    assert Volume.objects.get(pk=keyed.pk).state == State.CREATING  # its key re-drives it
    new_volume(api_client, "orphan")  # the name is free again


def test_a_delete_that_died_half_way_is_finished_by_a_retry_or_the_sweep(
    api_client: APIClient, monkeypatch: pytest.MonkeyPatch, runtime: LocalRuntime
) -> None:
    first = new_volume(api_client, "d1")
    second = new_volume(api_client, "d2")
    for made in (first, second):
        arm_crash(monkeypatch, "after_volume_delete")
        with pytest.raises(Crash):
            api_client.delete(f"/volumes/{made['volumeID']}")
        assert Volume.objects.get(pk=made["volumeID"]).state == State.DELETING
        assert_error(api_client.get(f"/volumes/{made['volumeID']}"), 404)
        assert made["volumeID"] not in listed_ids(api_client)
    assert api_client.delete(f"/volumes/{first['volumeID']}").status_code == 204
    removed = volume_services.volume_sweep(older_than=timezone.now() + timedelta(seconds=1))
    assert removed == [second["volumeID"]]
    assert not Volume.objects.exists()
    assert not has_storage(runtime, first["volumeID"])
    assert not has_storage(runtime, second["volumeID"])


# ------------------------------------------------------------------------------ mounts
def test_a_create_with_mounts_records_them_passes_them_to_the_runtime_and_reports_them(
    api_client: APIClient, create_sandbox: Callable[..., dict[str, Any]], runtime: LocalRuntime
) -> None:
    a = new_volume(api_client, "alpha")
    b = new_volume(api_client, "beta")
    mounts = [{"name": "beta", "path": "/mnt/b"}, {"name": "alpha", "path": "/data"}]
    sandbox_id = create_sandbox(volumeMounts=mounts)["sandboxID"]
    detail = api_client.get(f"/sandboxes/{sandbox_id}").json()
    assert detail["volumeMounts"] == mounts
    assert runtime.volume_users(a["volumeID"]) == {sandbox_id}
    assert runtime.volume_users(b["volumeID"]) == {sandbox_id}
    # A sandbox without mounts reports none.
    plain = create_sandbox()["sandboxID"]
    assert api_client.get(f"/sandboxes/{plain}").json()["volumeMounts"] == []


def test_invalid_mounts_are_400_with_e2bs_text_for_every_one_and_nothing_is_made(
    api_client: APIClient,
) -> None:
    new_volume(api_client, "ok")
    mounts = [
        {"name": "ok", "path": "/mnt/fine"},
        {"name": "missing", "path": "/mnt/x"},
        {"name": "ok", "path": "relative"},
        {"name": "ok", "path": "/mnt/../etc"},
        {"name": "ok", "path": "/mnt/trailing/"},
        {"name": "ok", "path": ""},
        {"name": "ok", "path": "/mnt/fine"},
        {"name": "ok", "path": "/"},
    ]
    response = api_client.post(
        "/v2/sandboxes", {"templateID": "base", "volumeMounts": mounts}, format="json"
    )
    body = assert_error(response, 400)
    assert body["message"] == (
        "invalid mounts:\n"
        "\t- volume mount #1: volume 'missing' not found\n"
        "\t- volume mount #2: path must be absolute\n"
        "\t- volume mount #3: path must not contain any '.' or '..' components\n"
        "\t- volume mount #4: path must not contain any '.' or '..' components\n"
        "\t- volume mount #5: path cannot be empty\n"
        "\t- volume mount #6: path '/mnt/fine' is already used\n"
        "\t- volume mount #7: path cannot be the root directory"
    )
    assert not Sandbox.objects.exists()
    assert not SandboxVolumeMount.objects.exists()


def test_nested_mounts_and_too_many_mounts_are_400(api_client: APIClient) -> None:
    new_volume(api_client, "n")
    nested = [{"name": "n", "path": "/mnt"}, {"name": "n", "path": "/mnt/inner"}]
    body = assert_error(
        api_client.post(
            "/v2/sandboxes", {"templateID": "base", "volumeMounts": nested}, format="json"
        ),
        400,
    )
    assert body["message"] == (
        "invalid mounts:\n\t- volume mount #1: path '/mnt/inner' is nested with '/mnt', "
        "another mount's"
    )
    many = [{"name": "n", "path": f"/m{i}"} for i in range(9)]
    body = assert_error(
        api_client.post(
            "/v2/sandboxes", {"templateID": "base", "volumeMounts": many}, format="json"
        ),
        400,
    )
    assert "at most 8 volume mounts" in body["message"]
    bad_shape = [{"name": "n"}]
    assert_error(
        api_client.post(
            "/v2/sandboxes", {"templateID": "base", "volumeMounts": bad_shape}, format="json"
        ),
        400,
    )
    assert not Sandbox.objects.exists()


def test_a_volume_being_deleted_or_of_another_host_cannot_be_mounted(
    api_client: APIClient, runtime: LocalRuntime
) -> None:
    here = new_volume(api_client, "elsewhere")
    Volume.objects.filter(pk=here["volumeID"]).update(host="another-host")
    body = assert_error(
        api_client.post(
            "/v2/sandboxes",
            {"templateID": "base", "volumeMounts": [{"name": "elsewhere", "path": "/v"}]},
            format="json",
        ),
        400,
    )
    assert "is stored on another host of this service (host " in body["message"]
    assert "another-host" not in body["message"] and runtime.host_id not in body["message"]
    body = assert_error(api_client.delete(f"/volumes/{here['volumeID']}"), 503)
    assert body["error_code"] == "volume_on_another_host"
    Volume.objects.filter(pk=here["volumeID"]).update(host=runtime.host_id, state=State.DELETING)
    body = assert_error(
        api_client.post(
            "/v2/sandboxes",
            {"templateID": "base", "volumeMounts": [{"name": "elsewhere", "path": "/v"}]},
            format="json",
        ),
        400,
    )
    assert body["message"] == "invalid mounts:\n\t- volume mount #0: volume 'elsewhere' not found"
    assert not Sandbox.objects.exists()


def test_a_keyed_create_replays_with_its_mounts_and_other_mounts_are_a_mismatch(
    api_client: APIClient,
) -> None:
    new_volume(api_client, "k")
    key = str(uuid.uuid4())
    body = {"templateID": "base", "volumeMounts": [{"name": "k", "path": "/k"}]}
    first = api_client.post("/v2/sandboxes", body, format="json", headers={"Idempotency-Key": key})
    assert first.status_code == 201, first.content
    again = api_client.post("/v2/sandboxes", body, format="json", headers={"Idempotency-Key": key})
    assert again.json()["sandboxID"] == first.json()["sandboxID"]
    other = {"templateID": "base", "volumeMounts": [{"name": "k", "path": "/other"}]}
    response = api_client.post(
        "/v2/sandboxes", other, format="json", headers={"Idempotency-Key": key}
    )
    assert assert_error(response, 409)["error_code"] == "idempotency_request_mismatch"
    assert SandboxVolumeMount.objects.count() == 1


# ------------------------------------------------------------------------ admin, metrics
def test_the_admin_shows_a_volumes_use_and_mounts_and_revokes_its_tokens(
    api_client: APIClient, admin_client: Any, create_sandbox: Callable[..., dict[str, Any]]
) -> None:
    made = new_volume(api_client, "seen")
    sandbox_id = create_sandbox(volumeMounts=[{"name": "seen", "path": "/mnt/seen"}])["sandboxID"]
    page = admin_client.get(f"/admin/sandboxes/volume/{made['volumeID']}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert " MB of 8 MB" in text
    assert f">{sandbox_id}</a> at /mnt/seen" in text
    listing = admin_client.get("/admin/sandboxes/volume/")
    assert listing.status_code == 200 and "seen" in listing.content.decode()
    response = admin_client.post(
        "/admin/sandboxes/volume/",
        {"action": "revoke_tokens", "_selected_action": [made["volumeID"]]},
    )
    assert response.status_code == 302
    volume = Volume.objects.get(pk=made["volumeID"])
    assert volume.token_epoch == 1
    assert not tokens.verify(made["token"], volume.volume_id, volume.token_epoch)
    fresh = api_client.get(f"/volumes/{made['volumeID']}").json()["token"]
    assert tokens.verify(fresh, volume.volume_id, volume.token_epoch)


def test_metrics_count_volumes_by_state(
    api_client: APIClient, anonymous_client: APIClient, team: Any
) -> None:
    new_volume(api_client, "m1")
    new_volume(api_client, "m2")
    Volume.objects.create(team=team, name="m3", size_mb=8, state=State.DELETING)
    text = anonymous_client.get("/metrics").content.decode()
    assert 'e2bfacade_volumes_by_state{state="ready"} 2.0' in text
    assert 'e2bfacade_volumes_by_state{state="deleting"} 1.0' in text
    assert 'e2bfacade_volumes_by_state{state="creating"} 0.0' in text
    assert 'e2bfacade_volumes_allocated_mb{state="ready"} 16.0' in text


def test_a_snapshot_or_a_fork_of_a_sandbox_does_not_carry_its_volumes(
    api_client: APIClient, create_sandbox: Callable[..., dict[str, Any]], runtime: LocalRuntime
) -> None:
    new_volume(api_client, "kept-out")
    source = create_sandbox(volumeMounts=[{"name": "kept-out", "path": "/mnt/v"}])["sandboxID"]
    wrote = run(runtime, source, ["sh", "-c", "echo in-volume > /mnt/v/f && echo own > /own"])
    assert wrote.exit_code == 0, wrote
    snap = api_client.post(f"/sandboxes/{source}/snapshots", {}, format="json")
    assert snap.status_code == 201, snap.content
    snapshot_id = snap.json()["snapshotID"]

    plain = create_sandbox(templateID=snapshot_id)["sandboxID"]
    assert api_client.get(f"/sandboxes/{plain}").json()["volumeMounts"] == []
    seen = run(runtime, plain, ["sh", "-c", "cat /own; cat /mnt/v/f 2>/dev/null || echo absent"])
    assert seen.stdout.decode() == "own\nabsent\n"
    # Its own create may name the volume, anywhere.
    named = create_sandbox(
        templateID=snapshot_id, volumeMounts=[{"name": "kept-out", "path": "/elsewhere"}]
    )["sandboxID"]
    assert run(runtime, named, ["cat", "/elsewhere/f"]).stdout.decode() == "in-volume\n"

    forks = api_client.post(f"/sandboxes/{source}/fork", {"count": 1, "timeout": 60}, "json")
    assert forks.status_code == 201, forks.content
    [fork] = forks.json()
    fork_id = fork["sandbox"]["sandboxID"]
    assert api_client.get(f"/sandboxes/{fork_id}").json()["volumeMounts"] == []
    assert runtime.volume_users(str(Volume.objects.get(name="kept-out").pk)) == {source, named}


def test_deleting_a_team_removes_its_volumes_and_mount_records(team: Any) -> None:
    volume = Volume.objects.create(team=team, name="t", size_mb=8, state=State.READY)
    sandbox = SandboxFactory.create(team=team)
    SandboxVolumeMount.objects.create(sandbox=sandbox, volume=volume, path="/t")
    with pytest.raises(RestrictedError):
        volume.delete()  # never while a mount names it
    team.delete()
    assert not Volume.objects.exists() and not SandboxVolumeMount.objects.exists()


def test_a_create_the_runtime_refuses_leaves_no_row_no_storage_and_releases_its_key(
    api_client: APIClient, runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = runtime.create_volume

    def half_made(volume_id: str, size_mb: int) -> Any:
        real(volume_id, size_mb)  # the storage is made, then the runtime fails
        raise LimitExceeded("the host's disk cannot hold another volume")

    monkeypatch.setattr(runtime, "create_volume", half_made)
    key = str(uuid.uuid4())
    body = assert_error(create_volume(api_client, "refused", key=key), 503)
    assert "the host's disk cannot hold another volume" in body["message"]
    assert not Volume.objects.exists()
    assert not IdempotencyRecord.objects.exists()
    assert not [p for p in (runtime.root / "volumes").iterdir() if not p.name.startswith(".")]
    monkeypatch.setattr(runtime, "create_volume", real)
    assert create_volume(api_client, "refused", key=key).status_code == 201


def test_the_worker_finishes_a_keyed_create_whose_client_never_retried(
    api_client: APIClient, monkeypatch: pytest.MonkeyPatch, runtime: LocalRuntime
) -> None:
    key = str(uuid.uuid4())
    arm_crash(monkeypatch, "after_claim")
    with pytest.raises(Crash):
        create_volume(api_client, "abandoned", key=key)
    record = IdempotencyRecord.objects.get(key=key)
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert record.pk in maintenance.drive_abandoned()
    assert Volume.objects.get(pk=record.resource_id).state == State.READY
    assert has_storage(runtime, record.resource_id)
    replay = create_volume(api_client, "abandoned", key=key)
    assert replay.status_code == 201 and replay.json()["volumeID"] == record.resource_id
