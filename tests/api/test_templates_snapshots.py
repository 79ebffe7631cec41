"""Templates, snapshots (templates made from a sandbox) and forks through the API, with the
runtime's images checked beside the rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import Team
from e2bfacade.runtime.base import SandboxState
from e2bfacade.runtime.local import LocalRuntime
from sandboxes.models import Sandbox
from templates.models import Template
from tests.api.helpers import assert_error, runtime_state
from tests.runtime.helpers import run
from tests.support.factories import TemplateFactory

CreateSandbox = Callable[..., dict[str, Any]]


def snapshot(client: APIClient, sandbox_id: str, **body: Any) -> Any:
    return client.post(f"/sandboxes/{sandbox_id}/snapshots", body, format="json")


def sh(runtime: LocalRuntime, sandbox_id: str, script: str) -> str:
    result = run(runtime, sandbox_id, ["sh", "-c", script])
    assert result.exit_code == 0, result
    return result.stdout.decode()


# ------------------------------------------------------------------------------ templates
def test_templates_list_the_public_base_and_the_teams_own_but_not_snapshots_or_others(
    api_client: APIClient, team: Team, other_team: Team
) -> None:
    mine = TemplateFactory.create(team=team, alias="mine")
    TemplateFactory.create(team=other_team, alias="theirs")
    TemplateFactory.create(team=team, alias="snap", kind=Template.Kind.SNAPSHOT)
    TemplateFactory.create(team=team, alias=None, kind=Template.Kind.FORK)

    response = api_client.get("/templates")

    assert response.status_code == 200
    listed = {t["templateID"]: t for t in response.json()}
    assert set(listed) == {"base", mine.pk}
    assert listed["base"]["public"] is True
    assert listed["base"]["aliases"] == ["base"]
    assert listed[mine.pk]["public"] is False


def test_a_template_is_shown_with_its_build(api_client: APIClient) -> None:
    response = api_client.get("/templates/base")

    assert response.status_code == 200
    body = response.json()
    assert body["templateID"] == "base"
    assert len(body["builds"]) == 1
    assert body["builds"][0]["status"] == "ready"
    assert body["builds"][0]["buildID"] == body["buildID"]


def test_an_unknown_template_answers_404(api_client: APIClient) -> None:
    assert_error(api_client.get("/templates/nope"), 404)


def test_template_aliases_answer_200_when_usable_403_when_another_teams_404_when_free(
    api_client: APIClient, other_team: Team, team: Team
) -> None:
    mine = TemplateFactory.create(team=team, alias="mine")
    TemplateFactory.create(team=other_team, alias="theirs")

    base = api_client.get("/templates/aliases/base")
    own = api_client.get("/templates/aliases/mine")

    assert base.status_code == own.status_code == 200
    assert base.json() == {"templateID": "base", "public": True}
    assert own.json() == {"templateID": mine.pk, "public": False}
    assert_error(api_client.get("/templates/aliases/theirs"), 403)
    assert_error(api_client.get("/templates/aliases/free"), 404)


def test_the_public_base_template_cannot_be_deleted(api_client: APIClient) -> None:
    assert_error(api_client.delete("/templates/base"), 403)
    assert Template.objects.filter(pk="base").exists()


# ------------------------------------------------------------------------------ snapshots
def test_a_snapshot_is_201_with_its_names_and_the_source_keeps_running(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]

    named = snapshot(api_client, sandbox_id, name="my-snap")
    unnamed = snapshot(api_client, sandbox_id)

    assert named.status_code == unnamed.status_code == 201
    assert named.json()["names"] == ["my-snap"]
    assert unnamed.json()["names"] == []
    assert named.json()["snapshotID"] != unnamed.json()["snapshotID"]
    assert Sandbox.objects.get(pk=sandbox_id).state == Sandbox.State.RUNNING
    assert runtime_state(runtime, sandbox_id) is SandboxState.RUNNING
    images = runtime.list_images()
    assert named.json()["snapshotID"] in images and unnamed.json()["snapshotID"] in images


def test_a_paused_sandbox_can_be_snapshotted_and_stays_paused(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    api_client.post(f"/sandboxes/{sandbox_id}/pause")

    response = snapshot(api_client, sandbox_id)

    assert response.status_code == 201
    assert runtime_state(runtime, sandbox_id) is SandboxState.PAUSED


def test_a_snapshot_name_already_taken_answers_409(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    snapshot(api_client, sandbox_id, name="taken")

    assert "taken" in assert_error(snapshot(api_client, sandbox_id, name="taken"), 409)["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [({"memory": True}, "memory"), ({"name": "no spaces"}, "name"), ({"name": 5}, "name")],
)
def test_a_snapshot_request_it_cannot_honour_is_a_400_naming_the_field(
    api_client: APIClient,
    create_sandbox: CreateSandbox,
    runtime: LocalRuntime,
    body: dict[str, Any],
    field: str,
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]

    response = snapshot(api_client, sandbox_id, **body)

    assert assert_error(response, 400)["message"].startswith(f"{field}: ")
    assert not Template.objects.filter(kind=Template.Kind.SNAPSHOT).exists()
    assert runtime.list_images() == ["base"]


def test_a_sandbox_created_from_a_snapshot_starts_with_the_sources_files(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    source_id = create_sandbox()["sandboxID"]
    sh(runtime, source_id, "echo from-the-source > /home/user/note")
    snapshot_id = snapshot(api_client, source_id, name="with-note").json()["snapshotID"]

    by_id = create_sandbox(templateID=snapshot_id)
    by_name = create_sandbox(templateID="with-note")

    for created in (by_id, by_name):
        assert created["templateID"] == snapshot_id
        assert sh(runtime, created["sandboxID"], "cat /home/user/note") == "from-the-source\n"


def test_deleting_a_snapshot_is_400_while_used_then_204_then_404(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    source_id = create_sandbox()["sandboxID"]
    snapshot_id = snapshot(api_client, source_id, name="used").json()["snapshotID"]
    user_id = create_sandbox(templateID=snapshot_id)["sandboxID"]

    in_use = api_client.delete(f"/templates/{snapshot_id}")

    assert "still used" in assert_error(in_use, 400)["message"]
    assert snapshot_id in runtime.list_images()

    assert api_client.delete(f"/sandboxes/{user_id}").status_code == 204
    deleted = api_client.delete(f"/templates/{snapshot_id}")
    again = api_client.delete(f"/templates/{snapshot_id}")

    assert deleted.status_code == 204
    assert_error(again, 404)
    assert not Template.objects.filter(pk=snapshot_id).exists()
    assert snapshot_id not in runtime.list_images()
    assert api_client.get("/snapshots").json() == []
    # The source never used the snapshot: it is untouched.
    assert runtime_state(runtime, source_id) is SandboxState.RUNNING


def test_a_paused_sandbox_also_keeps_its_snapshot_in_use(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    snapshot_id = snapshot(api_client, create_sandbox()["sandboxID"]).json()["snapshotID"]
    user_id = create_sandbox(templateID=snapshot_id)["sandboxID"]
    api_client.post(f"/sandboxes/{user_id}/pause")

    assert_error(api_client.delete(f"/templates/{snapshot_id}"), 400)


def test_a_snapshot_named_with_slash_and_colon_is_deleted_through_its_url_encoded_name(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    created = snapshot(api_client, sandbox_id, name="my/snap:v1")
    assert created.status_code == 201
    assert created.json()["names"] == ["my/snap:v1"]
    snapshot_id = created.json()["snapshotID"]

    # The SDK sends the name url-encoded, as here.
    deleted = api_client.delete("/templates/my%2Fsnap%3Av1")

    assert deleted.status_code == 204
    assert not Template.objects.filter(pk=snapshot_id).exists()
    assert snapshot_id not in runtime.list_images()
    assert_error(api_client.delete("/templates/my%2Fsnap%3Av1"), 404)


def test_snapshots_are_listed_newest_first_filtered_and_paged(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    first_id = create_sandbox()["sandboxID"]
    second_id = create_sandbox()["sandboxID"]
    a = snapshot(api_client, first_id, name="a").json()["snapshotID"]
    b = snapshot(api_client, first_id).json()["snapshotID"]
    c = snapshot(api_client, second_id, name="c").json()["snapshotID"]

    everything = api_client.get("/snapshots")
    of_first = api_client.get("/snapshots", {"sandboxID": first_id})
    named = api_client.get("/snapshots", {"name": "c"})
    page = api_client.get("/snapshots", {"limit": "2"})
    rest = api_client.get("/snapshots", {"limit": "2", "nextToken": page.headers["X-Next-Token"]})

    assert [s["snapshotID"] for s in everything.json()] == [c, b, a]
    assert {s["snapshotID"] for s in of_first.json()} == {a, b}
    assert named.json() == [{"snapshotID": c, "names": ["c"]}]
    assert [s["snapshotID"] for s in page.json() + rest.json()] == [c, b, a]
    assert "X-Next-Token" not in rest.headers
    assert_error(api_client.get("/snapshots", {"limit": "2", "nextToken": "forged"}), 400)


# ----------------------------------------------------------------------------------- forks
def test_a_fork_of_two_answers_201_with_two_running_sandboxes_holding_the_sources_files(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    source_id = create_sandbox()["sandboxID"]
    sh(runtime, source_id, "echo forked > /home/user/state")

    response = api_client.post(
        f"/sandboxes/{source_id}/fork", {"count": 2, "timeout": 60}, format="json"
    )

    assert response.status_code == 201
    entries = response.json()
    assert len(entries) == 2
    fork_ids = [e["sandbox"]["sandboxID"] for e in entries]
    assert len(set(fork_ids)) == 2 and source_id not in fork_ids
    for fork_id in fork_ids:
        assert Sandbox.objects.get(pk=fork_id).state == Sandbox.State.RUNNING
        assert runtime_state(runtime, fork_id) is SandboxState.RUNNING
        assert sh(runtime, fork_id, "cat /home/user/state") == "forked\n"
    assert runtime_state(runtime, source_id) is SandboxState.RUNNING
    # The image forks start from is hidden: neither a template nor a snapshot.
    fork_template = entries[0]["sandbox"]["templateID"]
    assert fork_template not in [t["templateID"] for t in api_client.get("/templates").json()]
    assert api_client.get("/snapshots").json() == []
    assert_error(api_client.get(f"/templates/{fork_template}"), 404)


def test_a_fork_without_a_body_makes_one_sandbox(
    api_client: APIClient, create_sandbox: CreateSandbox
) -> None:
    source_id = create_sandbox()["sandboxID"]

    response = api_client.post(f"/sandboxes/{source_id}/fork")

    assert response.status_code == 201
    assert len(response.json()) == 1


@pytest.mark.parametrize("count", [0, 21, "2"])
def test_a_fork_count_outside_1_to_20_is_a_400_and_nothing_is_made(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime, count: Any
) -> None:
    source_id = create_sandbox()["sandboxID"]

    response = api_client.post(f"/sandboxes/{source_id}/fork", {"count": count}, format="json")

    assert assert_error(response, 400)["message"].startswith("count: ")
    assert Sandbox.objects.count() == 1
    assert [i.sandbox_id for i in runtime.list()] == [source_id]
    assert runtime.list_images() == ["base"]


def test_a_fork_with_a_timeout_over_the_maximum_is_a_400_and_nothing_is_made(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime, settings: Any
) -> None:
    settings.SANDBOX_MAX_TIMEOUT_SECONDS = 100
    source_id = create_sandbox(timeout=50)["sandboxID"]

    response = api_client.post(f"/sandboxes/{source_id}/fork", {"timeout": 101}, format="json")

    assert_error(response, 400)
    assert runtime.list_images() == ["base"]
    assert Sandbox.objects.count() == 1


def test_a_fork_of_another_teams_sandbox_answers_404(
    other_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    source_id = create_sandbox()["sandboxID"]

    response = other_client.post(f"/sandboxes/{source_id}/fork", {"count": 2}, format="json")

    assert_error(response, 404)
    assert [i.sandbox_id for i in runtime.list()] == [source_id]
    assert runtime.list_images() == ["base"]
