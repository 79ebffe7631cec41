"""The Template SDK v2 routes on the wire, with raw httpx: the statuses the Python SDK parses
(it reads a body only for the documented one), the shapes it indexes without a default, and
E2B's error texts. The tag routes 2.63.0's client knows are checked against its own models.

The requests here share one template name, so each new one supersedes the waiting build of
the one before (a waiting build counts against the team's concurrent builds)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from e2b.api.client.models import (
    TemplateTagAssignmentsResponse,
    TemplateTagExistsResponse,
    TemplateTagGroupsResponse,
    TemplateTagsCountResponse,
)

from tests.contract.template_support import (
    SCRATCH,
    base_spec,
    build_raw,
    file_link,
    files_hash,
    q,
    request_build,
    run_step,
    status,
    tar_of,
    trigger,
    unique,
    wait_build,
)

SUPERSEDED = "The build was canceled because it was superseded by a newer one."
V1_REFUSED = (
    "v1 (docker push) builds are not supported; use 'e2b template create' or the Template SDK"
)


@pytest.fixture(scope="module")
def name() -> str:
    return SCRATCH


@pytest.fixture(scope="module")
def ready(raw: httpx.Client) -> dict[str, Any]:
    """One ready build, tagged ``v1`` only, with a small log."""
    made, info, _ = build_raw(
        raw,
        f"{unique('wire-ready')}:v1",
        base_spec(run_step("echo one; echo two"), run_step("echo three")),
    )
    assert info["status"] == "ready", info
    return made


def test_a_build_request_answers_202_with_all_six_keys(raw: httpx.Client, name: str) -> None:
    r = raw.post("/v3/templates", json={"name": f"{name}:v2", "tags": ["x"], "cpuCount": 1})
    assert r.status_code == 202, r.text
    body = r.json()
    assert set(body) == {"templateID", "buildID", "public", "names", "aliases", "tags"}
    assert body["tags"] == ["v2", "x"]
    assert body["public"] is False
    assert body["names"] == [name] and body["aliases"] == [name]
    info = status(raw, body["templateID"], body["buildID"]).json()
    assert info["status"] == "waiting"
    assert "reason" not in info  # null crashes the SDK


def test_a_files_link_is_201_with_headers_a_dict_and_present_after_upload(
    raw: httpx.Client, name: str, ready: dict[str, Any]
) -> None:
    made = request_build(raw, name)
    data = tar_of(("file", "a.txt", "hello"))
    digest = files_hash(data)
    link = file_link(raw, made["templateID"], digest)
    assert link["present"] is False
    assert link["headers"] == {}  # never null: the SDK iterates it
    assert link["url"].startswith(raw.base_url.scheme + "://")
    put = httpx.put(link["url"], content=data)
    assert put.status_code == 200, put.text
    again = file_link(raw, made["templateID"], digest)
    assert again["present"] is True
    assert isinstance(again["headers"], dict)
    # Archives are the team's: another template of the team sees it too.
    assert file_link(raw, ready["templateID"], digest)["present"] is True


def test_a_files_hash_that_is_not_e2b_shaped_is_refused(raw: httpx.Client, name: str) -> None:
    made = request_build(raw, name)
    r = raw.get(f"/templates/{made['templateID']}/files/..%2F..%2Fetc")
    assert r.status_code in (400, 404), r.text
    assert raw.get(f"/templates/{made['templateID']}/files/ABC").status_code == 400


def test_status_logs_page_by_offset_and_end_with_an_empty_page(
    raw: httpx.Client, ready: dict[str, Any]
) -> None:
    tid, bid = ready["templateID"], ready["buildID"]
    full = status(raw, tid, bid, logsOffset=0, limit=100).json()
    entries = full["logEntries"]
    assert full["status"] == "ready" and "reason" not in full
    assert len(entries) >= 4
    assert any(e["message"].endswith("[stdout]: three") for e in entries)
    assert {e["level"] for e in entries} <= {"debug", "info", "warn", "error"}
    second = status(raw, tid, bid, logsOffset=1, limit=2).json()["logEntries"]
    assert second == entries[1:3]
    assert status(raw, tid, bid, logsOffset=len(entries)).json()["logEntries"] == []
    assert status(raw, tid, bid, logsOffset=10**6).json()["logEntries"] == []
    assert status(raw, tid, bid, limit=101).status_code == 400
    assert status(raw, tid, bid, logsOffset=-1).status_code == 400
    # By name too, and with the name percent-encoded as the SDK sends it.
    alias = ready_alias(raw, tid)
    assert status(raw, alias, bid).status_code == 200


def ready_alias(raw: httpx.Client, template_id: str) -> str:
    listed = raw.get("/templates").json()
    return str(next(t["aliases"][0] for t in listed if t["templateID"] == template_id))


def test_unknown_and_foreign_builds(
    raw: httpx.Client, other_http: httpx.Client, ready: dict[str, Any]
) -> None:
    tid, bid = ready["templateID"], ready["buildID"]
    missing = "0b5c84b7-3f8e-4e35-9a4b-6d2b0f0e6c11"
    r = status(raw, tid, missing)
    assert r.status_code == 400 and r.json()["message"] == f"Build '{missing}' not found"
    foreign = status(other_http, tid, bid)
    assert foreign.status_code == 403, foreign.text
    assert "three" not in foreign.text
    assert trigger(other_http, tid, bid, base_spec()).status_code == 403
    assert other_http.get(f"/templates/{tid}/files/{'a' * 64}").status_code in (403, 404)


def test_a_trigger_replay_is_202_and_another_body_is_e2b_400(raw: httpx.Client, name: str) -> None:
    made = request_build(raw, name)
    spec = base_spec(run_step(f"echo replay {time.time()}"))
    assert trigger(raw, made["templateID"], made["buildID"], spec).status_code == 202
    assert trigger(raw, made["templateID"], made["buildID"], spec).status_code == 202
    other = trigger(raw, made["templateID"], made["buildID"], base_spec(run_step("echo other")))
    assert other.status_code == 400
    assert other.json()["message"] == "build is not in waiting state"
    info, log = wait_build(raw, made["templateID"], made["buildID"])
    assert info["status"] == "ready", info
    assert sum("echo replay" in e["message"] for e in log if "[builder 1/1] RUN" in e["message"])
    assert not any("echo other" in e["message"] for e in log)


def test_a_second_request_supersedes_a_waiting_build(raw: httpx.Client, name: str) -> None:
    first = request_build(raw, name)
    second = request_build(raw, name)
    assert second["buildID"] != first["buildID"]
    assert second["templateID"] == first["templateID"]
    old = status(raw, first["templateID"], first["buildID"]).json()
    assert old["status"] == "error"
    assert old["reason"]["message"] == SUPERSEDED
    late = trigger(raw, first["templateID"], first["buildID"], base_spec())
    assert late.status_code == 400 and late.json()["message"] == "build is not in waiting state"
    assert status(raw, second["templateID"], second["buildID"]).json()["status"] == "waiting"


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"cpuCount": 3}, "CPU count must be 1 or an even number"),
        ({"cpuCount": 0}, "CPU count must be between 1 and 32"),
        ({"memoryMB": 127}, "Memory must be at least 128 MiB"),
        ({"memoryMB": 129}, "Memory must be divisible by 2"),
    ],
)
def test_e2b_shape_rules_with_its_texts(
    raw: httpx.Client, name: str, shape: dict[str, int], message: str
) -> None:
    r = raw.post("/v3/templates", json={"name": name, "cpuCount": 1, "memoryMB": 512, **shape})
    assert r.status_code == 400, r.text
    assert r.json()["message"] == message


@pytest.mark.parametrize(
    "bad", ["Bad Name", "-x", "x:", "x:A B", f"x:{'0' * 8}-0000-0000-0000-{'0' * 12}"]
)
def test_invalid_names_and_tags_are_400(raw: httpx.Client, bad: str) -> None:
    assert raw.post("/v3/templates", json={"name": bad}).status_code == 400


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/templates"), ("POST", "/v2/templates"), ("POST", "/templates/some-id")],
)
def test_v1_builds_are_refused_with_their_text(raw: httpx.Client, method: str, path: str) -> None:
    r = raw.request(method, path, json={"dockerfile": "FROM ubuntu", "alias": "x"})
    assert r.status_code == 400, r.text
    assert r.json() == {"code": 400, "message": V1_REFUSED}


def test_percent_encoded_names_in_paths_reach_the_build(
    raw: httpx.Client, ready: dict[str, Any]
) -> None:
    tid, bid = ready["templateID"], ready["buildID"]
    alias = ready_alias(raw, tid)
    assert raw.get(f"/templates/{q(alias)}/builds/{bid}/status").json()["status"] == "ready"
    assert {t["tag"] for t in raw.get(f"/templates/{q(alias)}/tags").json()} == {"v1"}
    assert raw.get(f"/templates/{q(alias)}/files/{'b' * 64}").status_code == 201
    assert raw.get(f"/templates/aliases/{q(alias)}").json()["templateID"] == tid
    # An encoded ':' or '/' is part of the id, never a route separator.
    for ref in (f"{alias}:v1", f"{alias}/builds/{bid}"):
        r = raw.get(f"/templates/{q(ref)}/builds/{bid}/status")
        assert r.status_code == 400, (ref, r.text)
        assert r.json()["message"] == f"Build '{bid}' not found"


# ------------------------------------------------------------------------- tag routes
def test_tag_routes_of_2_63_answer_e2b_shapes(raw: httpx.Client, ready: dict[str, Any]) -> None:
    tid, bid = ready["templateID"], ready["buildID"]
    alias = ready_alias(raw, tid)
    made = raw.post("/templates/tags", json={"target": f"{alias}:v1", "tags": ["Prod"]})
    assert made.status_code == 201, made.text
    assert made.json() == {"buildID": bid, "tags": ["prod"]}

    count = raw.get(f"/templates/{q(alias)}/tags/count")
    assert count.status_code == 200
    # ``name:v1`` was built: v1 only (a plain name means ``default``), and now prod.
    assert TemplateTagsCountResponse.from_dict(count.json()).total == 2

    yes = TemplateTagExistsResponse.from_dict(
        raw.get(f"/templates/{q(alias)}/tags/exists", params={"tag": "PROD"}).json()
    )
    assert yes.exists is True and yes.normalized_tag == "prod"
    no = raw.get(f"/templates/{q(alias)}/tags/exists", params={"tag": "nope"}).json()
    assert no == {"exists": False, "normalizedTag": "nope"}
    bad = raw.get(f"/templates/{q(alias)}/tags/exists", params={"tag": "a b"})
    assert bad.status_code == 400

    groups = TemplateTagGroupsResponse.from_dict(raw.get(f"/templates/{tid}/tags/groups").json())
    by_tag = {g.tag: g for g in groups.tags}
    assert set(by_tag) == {"v1", "prod"}
    assert [str(a.build_id) for a in by_tag["prod"].assignments] == [bid]
    assert by_tag["prod"].has_more is False

    history = raw.get(f"/templates/{tid}/tags/prod/assignments")
    assert history.status_code == 200
    parsed = TemplateTagAssignmentsResponse.from_dict(history.json())
    assert [str(a.build_id) for a in parsed.data] == [bid]
    assert parsed.data[0].build_finished_at is not None

    gone = raw.request("DELETE", "/templates/tags", json={"name": alias, "tags": ["prod"]})
    assert gone.status_code == 204
    assert (
        TemplateTagsCountResponse.from_dict(raw.get(f"/templates/{tid}/tags/count").json()).total
        == 1
    )
    # The history stays after the tag is removed.
    assert len(raw.get(f"/templates/{tid}/tags/prod/assignments").json()["data"]) == 1


def test_tag_routes_of_another_team_are_closed(
    raw: httpx.Client, other_http: httpx.Client, ready: dict[str, Any]
) -> None:
    tid = ready["templateID"]
    alias = ready_alias(raw, tid)
    for path in (f"/templates/{tid}/tags", f"/templates/{tid}/tags/count"):
        assert other_http.get(path).status_code == 404, path
    steal = other_http.post("/templates/tags", json={"target": f"{alias}:v1", "tags": ["mine"]})
    assert steal.status_code in (403, 404), steal.text
    assert "mine" not in {t["tag"] for t in raw.get(f"/templates/{tid}/tags").json()}
    drop = other_http.request("DELETE", "/templates/tags", json={"name": alias, "tags": ["v1"]})
    assert drop.status_code in (403, 404), drop.text
    assert "v1" in {t["tag"] for t in raw.get(f"/templates/{tid}/tags").json()}


def test_another_team_cannot_start_a_sandbox_of_a_tagged_build(
    raw: httpx.Client, other_http: httpx.Client, ready: dict[str, Any]
) -> None:
    alias = ready_alias(raw, ready["templateID"])
    for ref in (f"{alias}:v1", alias, ready["templateID"]):
        r = other_http.post("/sandboxes", json={"templateID": ref, "timeout": 30})
        if r.status_code == 201:
            other_http.delete(f"/sandboxes/{r.json()['sandboxID']}")
        assert r.status_code == 404, (ref, r.status_code, r.text)
