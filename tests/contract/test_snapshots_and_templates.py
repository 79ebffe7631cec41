"""Snapshots, forks and templates through the Python SDK and raw HTTP.

There is no data plane (envd) yet, so nothing can be written inside a sandbox through the
SDK: these tests check the control plane's side only — a snapshot id is returned, listed,
usable as a template, deletable once; forks start as new sandboxes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from e2b import (
    InvalidArgumentException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    SnapshotInfo,
    Template,
)
from e2b.api.client.models import (
    Error,
    SandboxForkResult,
    TemplateAliasResponse,
    TemplateWithBuilds,
)
from e2b.api.client.models import SnapshotInfo as SnapshotInfoModel
from e2b.api.client.models import Template as TemplateModel

from tests.support.live_server import LiveServer

Register = Callable[[str], str]
MakeSandbox = Callable[..., Sandbox]


def all_snapshots(**kwargs: Any) -> list[SnapshotInfo]:
    paginator = Sandbox.list_snapshots(**kwargs)
    found: list[SnapshotInfo] = []
    while paginator.has_next:
        found += paginator.next_items()
    return found


def snapshot_ids(**kwargs: Any) -> list[str]:
    return [s.snapshot_id for s in all_snapshots(**kwargs)]


def assert_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == status and body["message"], body
    Error.from_dict(body)
    return body


@pytest.fixture
def snapshot_of(delete_template_later: Register) -> Callable[..., SnapshotInfo]:
    """``snapshot_of(sandbox, name=None)``: a snapshot deleted at teardown."""

    def take(sandbox: Sandbox, name: str | None = None) -> SnapshotInfo:
        snapshot = sandbox.create_snapshot(name=name)
        delete_template_later(snapshot.snapshot_id)
        return snapshot

    return take


# ---------------------------------------------------------------------------- snapshots
def test_create_snapshot_returns_an_id_and_its_name_and_the_source_keeps_running(
    sandbox: Sandbox, snapshot_of: Callable[..., SnapshotInfo], tag: str
) -> None:
    before = sandbox.get_info()

    snapshot = snapshot_of(sandbox, name=f"snap-{tag}")

    assert snapshot.snapshot_id
    assert any(f"snap-{tag}" in name for name in snapshot.names), snapshot.names
    after = sandbox.get_info()
    assert after.state == SandboxState.RUNNING
    assert after.end_at == before.end_at


def test_list_snapshots_filters_by_sandbox_and_name_and_pages(
    make_sandbox: MakeSandbox, snapshot_of: Callable[..., SnapshotInfo], tag: str
) -> None:
    source = make_sandbox()
    bystander = make_sandbox()
    taken = [snapshot_of(source).snapshot_id for _ in range(2)]
    named = snapshot_of(source, name=f"named-{tag}").snapshot_id
    elsewhere = snapshot_of(bystander).snapshot_id

    assert sorted(snapshot_ids(sandbox_id=source.sandbox_id)) == sorted([*taken, named])
    assert snapshot_ids(sandbox_id=bystander.sandbox_id) == [elsewhere]
    assert snapshot_ids(name=f"named-{tag}") == [named]
    assert {*taken, named, elsewhere} <= set(snapshot_ids())

    paginator = source.list_snapshots(limit=2)  # type: ignore[misc]  # the SDK's dual-use method
    pages = []
    while paginator.has_next:
        pages.append([s.snapshot_id for s in paginator.next_items()])
    assert [len(page) for page in pages] == [2, 1]
    assert sorted(sum(pages, [])) == sorted([*taken, named])


def test_a_snapshot_id_or_name_can_be_used_as_the_template_of_a_new_sandbox(
    sandbox: Sandbox, make_sandbox: MakeSandbox, snapshot_of: Callable[..., SnapshotInfo], tag: str
) -> None:
    snapshot = snapshot_of(sandbox, name=f"tpl-{tag}")

    by_id = make_sandbox(template=snapshot.snapshot_id)
    info = by_id.get_info()
    assert info.state == SandboxState.RUNNING
    assert info.template_id == snapshot.snapshot_id

    by_name = make_sandbox(template=f"tpl-{tag}")
    assert by_name.get_info().template_id == snapshot.snapshot_id


def test_delete_snapshot_answers_true_then_false_and_the_snapshot_is_gone(
    sandbox: Sandbox, snapshot_of: Callable[..., SnapshotInfo]
) -> None:
    snapshot = snapshot_of(sandbox)

    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
    assert snapshot.snapshot_id not in snapshot_ids(sandbox_id=sandbox.sandbox_id)
    with pytest.raises(SandboxException) as raised:
        Sandbox.create(snapshot.snapshot_id, timeout=30)
    assert raised.value.status_code == 404


def test_a_snapshot_in_use_cannot_be_deleted_until_its_sandboxes_are_gone(
    sandbox: Sandbox, make_sandbox: MakeSandbox, snapshot_of: Callable[..., SnapshotInfo]
) -> None:
    snapshot = snapshot_of(sandbox)
    derived = make_sandbox(template=snapshot.snapshot_id)

    with pytest.raises(SandboxException) as raised:
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    assert raised.value.status_code == 400
    assert snapshot.snapshot_id in snapshot_ids(sandbox_id=sandbox.sandbox_id)

    derived.kill()
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True


def test_a_snapshot_outlives_the_sandbox_it_was_taken_from(
    make_sandbox: MakeSandbox, snapshot_of: Callable[..., SnapshotInfo]
) -> None:
    source = make_sandbox()
    snapshot = snapshot_of(source)
    source.kill()

    assert snapshot.snapshot_id in snapshot_ids()
    assert make_sandbox(template=snapshot.snapshot_id).get_info().state == SandboxState.RUNNING


def test_a_namespaced_snapshot_name_is_deleted_through_its_url_encoded_path(
    sandbox: Sandbox, snapshot_of: Callable[..., SnapshotInfo], tag: str
) -> None:
    name = f"team-{tag}/snap:v1"  # the SDK sends it as team-…%2Fsnap%3Av1
    snapshot = snapshot_of(sandbox, name=name)

    assert snapshot_ids(name=name) == [snapshot.snapshot_id]
    assert Sandbox.delete_snapshot(name) is True
    assert Sandbox.delete_snapshot(name) is False
    assert snapshot.snapshot_id not in snapshot_ids()
    assert Sandbox.delete_snapshot(f"team-{tag}/never:v9") is False


def test_create_snapshot_of_an_unknown_sandbox_raises_sandbox_not_found(
    sdk_env: LiveServer,
) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot("inosuchsandbox000000")


def test_another_team_cannot_see_use_or_delete_our_snapshot(
    sandbox: Sandbox, snapshot_of: Callable[..., SnapshotInfo], sdk_env: LiveServer, tag: str
) -> None:
    other_key = sdk_env.other_api_key
    snapshot = snapshot_of(sandbox, name=f"private-{tag}")

    assert snapshot.snapshot_id not in snapshot_ids(api_key=other_key)
    assert snapshot_ids(sandbox_id=sandbox.sandbox_id, api_key=other_key) == []
    with pytest.raises(SandboxException) as raised:
        Sandbox.create(snapshot.snapshot_id, timeout=30, api_key=other_key)
    assert raised.value.status_code == 404
    assert Sandbox.delete_snapshot(snapshot.snapshot_id, api_key=other_key) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot(sandbox.sandbox_id, api_key=other_key)

    assert snapshot.snapshot_id in snapshot_ids(sandbox_id=sandbox.sandbox_id)


def test_snapshot_routes_answer_the_documented_shapes(
    http: httpx.Client, sandbox: Sandbox, delete_template_later: Register
) -> None:
    sandbox_id = sandbox.sandbox_id
    created = http.post(f"/sandboxes/{sandbox_id}/snapshots", json={})
    assert created.status_code == 201, created.text
    body = created.json()
    assert set(body) == {"snapshotID", "names"}
    snapshot_id = delete_template_later(SnapshotInfoModel.from_dict(body).snapshot_id)
    second = delete_template_later(
        http.post(f"/sandboxes/{sandbox_id}/snapshots").json()["snapshotID"]
    )

    first_page = http.get("/snapshots", params={"sandboxID": sandbox_id, "limit": 1})
    assert first_page.status_code == 200
    assert len(first_page.json()) == 1
    token = first_page.headers["x-next-token"]
    last_page = http.get(
        "/snapshots", params={"sandboxID": sandbox_id, "limit": 1, "nextToken": token}
    )
    assert "x-next-token" not in last_page.headers
    assert sorted(s["snapshotID"] for s in first_page.json() + last_page.json()) == sorted(
        [snapshot_id, second]
    )
    assert_error(http.get("/snapshots", params={"nextToken": token[:-3] + "xyz"}), 400)

    assert http.delete(f"/templates/{snapshot_id}").status_code == 204
    assert_error(http.delete(f"/templates/{snapshot_id}"), 404)
    assert_error(http.post("/sandboxes/inosuchsandbox000000/snapshots", json={}), 404)


# -------------------------------------------------------------------------------- forks
def test_fork_starts_count_new_running_sandboxes_and_the_source_keeps_running(
    sandbox: Sandbox, kill_later: Register
) -> None:
    before = sandbox.get_info()

    forks = sandbox.fork(count=2, timeout=60)

    assert len(forks) == 2
    for fork in forks:
        assert isinstance(fork, Sandbox), fork
        kill_later(fork.sandbox_id)
    ids = {fork.sandbox_id for fork in forks if isinstance(fork, Sandbox)}
    assert len(ids) == 2 and sandbox.sandbox_id not in ids
    for fork in forks:
        assert isinstance(fork, Sandbox)
        info = fork.get_info()
        assert info.state == SandboxState.RUNNING
        assert (info.end_at - info.started_at).total_seconds() == pytest.approx(60, abs=1)
    assert ids <= set(_listed_ids())
    after = sandbox.get_info()
    assert after.state == SandboxState.RUNNING
    assert after.end_at == before.end_at


def _listed_ids() -> list[str]:
    paginator = Sandbox.list(query=SandboxQuery())
    ids: list[str] = []
    while paginator.has_next:
        ids += [s.sandbox_id for s in paginator.next_items()]
    return ids


def test_fork_by_id_of_an_unknown_or_foreign_sandbox_raises_sandbox_not_found(
    sandbox: Sandbox, sdk_env: LiveServer
) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork("inosuchsandbox000000", count=1)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(sandbox.sandbox_id, count=1, api_key=sdk_env.other_api_key)
    with pytest.raises(InvalidArgumentException):
        sandbox.fork(count=21)  # refused by the SDK itself: 1..20


def test_fork_route_defaults_to_one_fork_for_15_seconds(
    http: httpx.Client, sandbox: Sandbox, kill_later: Register
) -> None:
    response = http.post(f"/sandboxes/{sandbox.sandbox_id}/fork", json={})
    assert response.status_code == 201, response.text
    (entry,) = response.json()
    result = SandboxForkResult.from_dict(entry)
    fork_id = kill_later(entry["sandbox"]["sandboxID"])
    assert result.sandbox and result.sandbox.sandbox_id == fork_id
    info = http.get(f"/sandboxes/{fork_id}").json()
    assert info["state"] == "running"
    started, ended = info["startedAt"], info["endAt"]
    from datetime import datetime

    lifetime = (datetime.fromisoformat(ended) - datetime.fromisoformat(started)).total_seconds()
    assert lifetime == pytest.approx(15, abs=1)

    assert_error(http.post(f"/sandboxes/{sandbox.sandbox_id}/fork", json={"count": 21}), 400)
    assert_error(http.post("/sandboxes/inosuchsandbox000000/fork", json={}), 404)


# ---------------------------------------------------------------------------- templates
def test_templates_list_includes_the_public_base_template_in_the_sdk_shape(
    http: httpx.Client,
) -> None:
    response = http.get("/templates")
    assert response.status_code == 200
    templates = [TemplateModel.from_dict(item) for item in response.json()]
    (base,) = [t for t in templates if t.template_id == "base"]
    assert base.public is True
    assert "base" in base.aliases


def test_get_template_answers_template_with_builds_by_id_or_alias(http: httpx.Client) -> None:
    response = http.get("/templates/base")
    assert response.status_code == 200
    template = TemplateWithBuilds.from_dict(response.json())
    assert template.template_id == "base"
    assert len(template.builds) >= 1
    assert_error(http.get("/templates/no-such-template-xyz"), 404)


def test_template_alias_lookup_answers_200_403_or_404(
    http: httpx.Client,
    other_http: httpx.Client,
    sandbox: Sandbox,
    snapshot_of: Callable[..., SnapshotInfo],
    tag: str,
) -> None:
    ours = http.get("/templates/aliases/base")
    assert ours.status_code == 200
    alias = TemplateAliasResponse.from_dict(ours.json())
    assert alias.template_id == "base" and alias.public is True

    assert_error(http.get(f"/templates/aliases/free-{tag}"), 404)

    snapshot_of(sandbox, name=f"owned-{tag}")
    assert http.get(f"/templates/aliases/owned-{tag}").status_code == 200
    assert_error(other_http.get(f"/templates/aliases/owned-{tag}"), 403)


def test_template_exists_in_the_sdk_sees_public_owned_and_foreign_aliases(
    sandbox: Sandbox, snapshot_of: Callable[..., SnapshotInfo], sdk_env: LiveServer, tag: str
) -> None:
    snapshot_of(sandbox, name=f"exists-{tag}")

    assert Template.exists("base") is True
    assert Template.exists(f"exists-{tag}") is True
    assert Template.exists(f"exists-{tag}", api_key=sdk_env.other_api_key) is True  # 403: taken
    assert Template.exists(f"never-{tag}") is False


def test_the_public_base_template_cannot_be_deleted_by_a_team(http: httpx.Client) -> None:
    response = http.delete("/templates/base")
    assert 400 <= response.status_code < 500
    assert_error(response, response.status_code)
    assert http.get("/templates/base").status_code == 200


def test_deleting_an_unknown_template_answers_404_even_with_encoded_separators(
    http: httpx.Client,
) -> None:
    for ref in ("no-such-template-xyz", "team/name:tag", "a:b"):
        assert_error(http.delete(f"/templates/{quote(ref, safe='')}"), 404)
