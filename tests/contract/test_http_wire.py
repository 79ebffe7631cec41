"""The wire itself, over raw HTTP: the statuses, headers and body shapes the SDKs rely on
but hide (docs/ARCHITECTURE.md, "Routes"). Bodies are also fed to the SDK's own generated
models (``from_dict``), which fail exactly where the SDK would."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from e2b.api.client.models import (
    Error,
    ListedSandbox,
    SandboxDetail,
    SandboxMetric,
)
from e2b.api.client.models import (
    Sandbox as SandboxModel,
)

from tests.support.live_server import LiveServer

SLACK = timedelta(seconds=3)
Register = Callable[[str], str]
UNKNOWN = "inosuchsandbox000000"


def when(value: str) -> datetime:
    return datetime.fromisoformat(value)


def lifetime(item: dict[str, Any]) -> float:
    return (when(item["endAt"]) - when(item["startedAt"])).total_seconds()


def assert_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """``{code, message, error_code?}`` with ``code`` equal to the status, as JSON."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body: dict[str, Any] = response.json()
    assert body["code"] == status, body
    assert isinstance(body["message"], str) and body["message"].strip(), body
    assert set(body) <= {"code", "message", "error_code"}, body
    Error.from_dict(body)
    return body


def create(
    http: httpx.Client, kill_later: Register, path: str = "/v2/sandboxes", **body: Any
) -> dict[str, Any]:
    body.setdefault("templateID", "base")
    response = http.post(path, json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    kill_later(created["sandboxID"])
    return created


def detail(http: httpx.Client, sandbox_id: str) -> dict[str, Any]:
    response = http.get(f"/sandboxes/{sandbox_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# ------------------------------------------------------------------------------- create
def test_create_v2_answers_201_with_the_required_sandbox_fields_and_a_300_second_default(
    http: httpx.Client, kill_later: Register
) -> None:
    body = create(http, kill_later)

    assert {"templateID", "sandboxID", "clientID", "envdVersion"} <= body.keys()
    assert body["templateID"] == "base"
    assert body["sandboxID"]
    parsed = SandboxModel.from_dict(body)
    assert parsed.sandbox_id == body["sandboxID"]
    assert lifetime(detail(http, body["sandboxID"])) == pytest.approx(300, abs=1)


def test_create_v1_answers_201_and_defaults_the_timeout_to_15_seconds(
    http: httpx.Client, kill_later: Register
) -> None:
    body = create(http, kill_later, "/sandboxes", secure=True)

    assert {"templateID", "sandboxID", "clientID", "envdVersion"} <= body.keys()
    SandboxModel.from_dict(body)
    assert lifetime(detail(http, body["sandboxID"])) == pytest.approx(15, abs=1)


def test_create_accepts_what_the_sdk_always_sends_and_ignores_unknown_fields(
    http: httpx.Client, kill_later: Register, tag: str
) -> None:
    body = create(
        http,
        kill_later,
        timeout=45,
        autoPause=False,
        metadata={"tag": tag},
        envVars={},
        aFieldFromTheFuture={"x": 1},
    )

    info = detail(http, body["sandboxID"])
    assert info["metadata"] == {"tag": tag}
    assert lifetime(info) == pytest.approx(45, abs=1)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({}, "templateID is required"),
        ({"templateID": "base", "timeout": 0}, "timeout must be positive"),
        ({"templateID": "base", "timeout": "soon"}, "timeout must be an integer"),
        ({"templateID": "base", "metadata": {"n": 1}}, "metadata values are strings"),
        ({"templateID": "base", "envVars": ["A=1"]}, "envVars is an object"),
    ],
)
def test_create_with_an_invalid_body_is_a_400(
    http: httpx.Client, body: dict[str, Any], why: str
) -> None:
    assert_error(http.post("/v2/sandboxes", json=body), 400)


def test_create_with_a_timeout_over_the_team_maximum_is_a_400(
    http: httpx.Client, live_server_e2b: LiveServer
) -> None:
    response = http.post(
        "/v2/sandboxes", json={"templateID": "base", "timeout": live_server_e2b.max_timeout + 1}
    )
    assert str(live_server_e2b.max_timeout) in assert_error(response, 400)["message"]


def test_create_from_an_unknown_template_is_a_404_naming_it(http: httpx.Client) -> None:
    response = http.post("/v2/sandboxes", json={"templateID": "no-such-template-wire"})
    assert "no-such-template-wire" in assert_error(response, 404)["message"]


def test_create_with_a_chunked_body_reads_the_body(
    http: httpx.Client, kill_later: Register, tag: str
) -> None:
    # The JS SDK (Node's fetch) sends request bodies with Transfer-Encoding: chunked and no
    # Content-Length. The body must still be read.
    def chunks() -> Any:
        yield b'{"templateID": "base", '
        yield f'"timeout": 40, "metadata": {{"tag": "{tag}"}}}}'.encode()

    response = http.post(
        "/v2/sandboxes", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 201, response.text
    sandbox_id = kill_later(response.json()["sandboxID"])
    info = detail(http, sandbox_id)
    assert info["metadata"] == {"tag": tag}
    assert lifetime(info) == pytest.approx(40, abs=1)


def test_a_create_replayed_for_the_same_idempotency_key_is_byte_identical_and_marked(
    http: httpx.Client, kill_later: Register
) -> None:
    headers = {"Idempotency-Key": f"contract-{uuid.uuid4()}"}
    body = {"templateID": "base", "timeout": 30}

    first = http.post("/v2/sandboxes", json=body, headers=headers)
    assert first.status_code == 201, first.text
    kill_later(first.json()["sandboxID"])
    replay = http.post("/v2/sandboxes", json=body, headers=headers)

    assert replay.status_code == 201
    assert replay.content == first.content
    assert replay.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in first.headers
    mismatch = http.post("/v2/sandboxes", json={**body, "timeout": 31}, headers=headers)
    assert assert_error(mismatch, 409).get("error_code") == "idempotency_request_mismatch"


# ---------------------------------------------------------------------------- get, list
def test_get_answers_a_sandbox_detail_the_sdk_can_parse(
    http: httpx.Client, kill_later: Register, tag: str
) -> None:
    sandbox_id = create(http, kill_later, timeout=60, metadata={"tag": tag})["sandboxID"]

    body = detail(http, sandbox_id)
    parsed = SandboxDetail.from_dict(body)
    assert parsed.sandbox_id == sandbox_id
    assert body["templateID"] == "base"
    assert body["state"] == "running"
    assert body["metadata"] == {"tag": tag}
    assert body["lifecycle"] == {"autoResume": False, "onTimeout": "kill"}
    for name in ("cpuCount", "memoryMB", "diskSizeMB"):
        assert isinstance(body[name], int) and body[name] > 0, name
    assert when(body["startedAt"]).tzinfo is not None


def test_list_v2_answers_listed_sandboxes_the_sdk_can_parse(
    http: httpx.Client, kill_later: Register, tag: str
) -> None:
    sandbox_id = create(http, kill_later, metadata={"tag": tag})["sandboxID"]

    response = http.get("/v2/sandboxes", params={"metadata": f"tag={tag}"})
    assert response.status_code == 200
    (item,) = response.json()
    listed = ListedSandbox.from_dict(item)
    assert listed.sandbox_id == sandbox_id
    assert item["state"] == "running"
    assert "x-next-token" not in response.headers


def test_list_v1_lists_running_sandboxes_only(
    http: httpx.Client, kill_later: Register, tag: str
) -> None:
    running = create(http, kill_later, metadata={"tag": tag})["sandboxID"]
    paused = create(http, kill_later, metadata={"tag": tag})["sandboxID"]
    assert http.post(f"/sandboxes/{paused}/pause").status_code == 204

    response = http.get("/sandboxes", params={"metadata": f"tag={tag}"})
    assert response.status_code == 200
    assert [item["sandboxID"] for item in response.json()] == [running]
    ListedSandbox.from_dict(response.json()[0])

    both = http.get("/v2/sandboxes", params={"metadata": f"tag={tag}"}).json()
    assert sorted(item["sandboxID"] for item in both) == sorted([running, paused])


def test_x_next_token_is_sent_only_when_another_page_exists(
    http: httpx.Client, kill_later: Register, tag: str
) -> None:
    created = [create(http, kill_later, metadata={"tag": tag})["sandboxID"] for _ in range(3)]
    query = {"metadata": f"tag={tag}"}

    whole = http.get("/v2/sandboxes", params={**query, "limit": 3})
    assert len(whole.json()) == 3
    assert "x-next-token" not in whole.headers

    first = http.get("/v2/sandboxes", params={**query, "limit": 2})
    assert len(first.json()) == 2
    token = first.headers["x-next-token"]
    assert token

    last = http.get("/v2/sandboxes", params={**query, "limit": 2, "nextToken": token})
    assert last.status_code == 200
    assert len(last.json()) == 1
    assert "x-next-token" not in last.headers
    seen = [item["sandboxID"] for item in first.json() + last.json()]
    assert sorted(seen) == sorted(created)


def test_a_tampered_next_token_is_a_400_in_the_error_shape(
    http: httpx.Client, kill_later: Register, tag: str
) -> None:
    for _ in range(2):
        create(http, kill_later, metadata={"tag": tag})
    token = http.get("/v2/sandboxes", params={"metadata": f"tag={tag}", "limit": 1}).headers[
        "x-next-token"
    ]
    tampered = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")

    for bad in (tampered, "not-a-token", token + "x"):
        response = http.get(
            "/v2/sandboxes", params={"metadata": f"tag={tag}", "limit": 1, "nextToken": bad}
        )
        assert_error(response, 400)


@pytest.mark.parametrize(
    "params",
    [{"limit": "0"}, {"limit": "101"}, {"limit": "ten"}, {"state": "dead"}, {"order": "sideways"}],
)
def test_list_with_an_invalid_query_is_a_400(http: httpx.Client, params: dict[str, str]) -> None:
    assert_error(http.get("/v2/sandboxes", params=params), 400)


# -------------------------------------------------------------------------- transitions
def test_refreshes_extend_the_end_time_but_never_shorten_it(
    http: httpx.Client, kill_later: Register
) -> None:
    sandbox_id = create(http, kill_later, timeout=600)["sandboxID"]
    end_at = when(detail(http, sandbox_id)["endAt"])

    for body in ({"duration": 30}, None, {}):
        response = http.post(f"/sandboxes/{sandbox_id}/refreshes", json=body)
        assert response.status_code == 204, response.text
        assert when(detail(http, sandbox_id)["endAt"]) == end_at

    requested = datetime.now(UTC) + timedelta(seconds=1800)
    assert (
        http.post(f"/sandboxes/{sandbox_id}/refreshes", json={"duration": 1800}).status_code == 204
    )
    extended = when(detail(http, sandbox_id)["endAt"])
    assert extended > end_at
    assert abs(extended - requested) <= SLACK

    assert_error(http.post(f"/sandboxes/{sandbox_id}/refreshes", json={"duration": 3601}), 400)
    assert_error(http.post(f"/sandboxes/{UNKNOWN}/refreshes", json={}), 404)


def test_refreshes_under_15_seconds_count_as_15(http: httpx.Client, kill_later: Register) -> None:
    sandbox_id = create(http, kill_later, timeout=5)["sandboxID"]

    requested = datetime.now(UTC) + timedelta(seconds=15)
    assert http.post(f"/sandboxes/{sandbox_id}/refreshes", json={"duration": 1}).status_code == 204
    assert abs(when(detail(http, sandbox_id)["endAt"]) - requested) <= SLACK


def test_pause_answers_204_then_409_when_already_paused(
    http: httpx.Client, kill_later: Register
) -> None:
    sandbox_id = create(http, kill_later)["sandboxID"]

    first = http.post(f"/sandboxes/{sandbox_id}/pause")
    assert first.status_code == 204
    assert first.content == b""
    assert_error(http.post(f"/sandboxes/{sandbox_id}/pause", json={}), 409)
    assert detail(http, sandbox_id)["state"] == "paused"
    assert_error(http.post(f"/sandboxes/{UNKNOWN}/pause"), 404)


def test_resume_answers_201_when_paused_and_409_when_running(
    http: httpx.Client, kill_later: Register
) -> None:
    sandbox_id = create(http, kill_later)["sandboxID"]
    assert_error(http.post(f"/sandboxes/{sandbox_id}/resume", json={}), 409)
    assert http.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204

    requested = datetime.now(UTC) + timedelta(seconds=15)
    resumed = http.post(f"/sandboxes/{sandbox_id}/resume", json={})
    assert resumed.status_code == 201, resumed.text
    assert SandboxModel.from_dict(resumed.json()).sandbox_id == sandbox_id
    info = detail(http, sandbox_id)
    assert info["state"] == "running"
    assert abs(when(info["endAt"]) - requested) <= SLACK  # legacy resume: 15 s by default

    assert_error(http.post(f"/sandboxes/{sandbox_id}/resume", json={"timeout": 60}), 409)
    assert_error(http.post(f"/sandboxes/{UNKNOWN}/resume", json={}), 404)


@pytest.mark.parametrize("path", ["/v2/sandboxes/{id}/connect", "/sandboxes/{id}/connect"])
def test_connect_answers_200_when_running_and_201_when_it_resumes(
    http: httpx.Client, kill_later: Register, path: str
) -> None:
    sandbox_id = create(http, kill_later, timeout=600)["sandboxID"]
    url = path.format(id=sandbox_id)
    end_at = when(detail(http, sandbox_id)["endAt"])

    running = http.post(url, json={"timeout": 10})
    assert running.status_code == 200, running.text
    assert SandboxModel.from_dict(running.json()).sandbox_id == sandbox_id
    assert when(detail(http, sandbox_id)["endAt"]) == end_at

    assert http.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
    resumed = http.post(url, json={"timeout": 120})
    assert resumed.status_code == 201, resumed.text
    SandboxModel.from_dict(resumed.json())
    assert detail(http, sandbox_id)["state"] == "running"

    assert_error(http.post(path.format(id=UNKNOWN), json={}), 404)


def test_connect_v2_accepts_no_body_and_defaults_to_300_seconds(
    http: httpx.Client, kill_later: Register
) -> None:
    sandbox_id = create(http, kill_later, timeout=10)["sandboxID"]

    requested = datetime.now(UTC) + timedelta(seconds=300)
    assert http.post(f"/v2/sandboxes/{sandbox_id}/connect").status_code == 200
    assert abs(when(detail(http, sandbox_id)["endAt"]) - requested) <= SLACK


def test_timeout_answers_204_sets_the_end_time_and_404s_for_a_paused_sandbox(
    http: httpx.Client, kill_later: Register, live_server_e2b: LiveServer
) -> None:
    sandbox_id = create(http, kill_later, timeout=600)["sandboxID"]

    requested = datetime.now(UTC) + timedelta(seconds=20)
    response = http.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 20})
    assert response.status_code == 204
    assert abs(when(detail(http, sandbox_id)["endAt"]) - requested) <= SLACK

    assert_error(http.post(f"/sandboxes/{sandbox_id}/timeout", json={}), 400)
    over = {"timeout": live_server_e2b.max_timeout + 1}
    assert_error(http.post(f"/sandboxes/{sandbox_id}/timeout", json=over), 400)

    assert http.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
    assert_error(http.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 20}), 404)


def test_delete_answers_204_then_404(http: httpx.Client, kill_later: Register) -> None:
    sandbox_id = create(http, kill_later)["sandboxID"]

    first = http.delete(f"/sandboxes/{sandbox_id}")
    assert first.status_code == 204
    assert first.content == b""
    assert_error(http.delete(f"/sandboxes/{sandbox_id}"), 404)
    assert_error(http.get(f"/sandboxes/{sandbox_id}"), 404)


def test_delete_of_a_paused_sandbox_answers_204(http: httpx.Client, kill_later: Register) -> None:
    sandbox_id = create(http, kill_later)["sandboxID"]
    assert http.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204

    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 204
    assert_error(http.post(f"/v2/sandboxes/{sandbox_id}/connect", json={}), 404)


def test_metrics_answers_samples_with_every_required_field(
    http: httpx.Client, kill_later: Register
) -> None:
    sandbox_id = create(http, kill_later)["sandboxID"]

    response = http.get(f"/sandboxes/{sandbox_id}/metrics")
    assert response.status_code == 200
    samples = response.json()
    assert samples
    for sample in samples:
        metric = SandboxMetric.from_dict(sample)
        assert metric.cpu_count > 0
        assert metric.mem_total > 0
    assert_error(http.get(f"/sandboxes/{UNKNOWN}/metrics"), 404)


# ------------------------------------------------------------------------- errors, auth
def test_another_teams_sandbox_answers_exactly_like_a_missing_one(
    http: httpx.Client, other_http: httpx.Client, kill_later: Register
) -> None:
    sandbox_id = create(http, kill_later)["sandboxID"]

    theirs = assert_error(other_http.get(f"/sandboxes/{sandbox_id}"), 404)
    missing = assert_error(other_http.get(f"/sandboxes/{UNKNOWN}"), 404)
    assert (
        theirs["message"]
        == f"Sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it"
    )
    assert theirs == {**missing, "message": missing["message"].replace(UNKNOWN, sandbox_id)}

    for method, path, body in [
        ("DELETE", f"/sandboxes/{sandbox_id}", None),
        ("POST", f"/sandboxes/{sandbox_id}/pause", {}),
        ("POST", f"/sandboxes/{sandbox_id}/resume", {}),
        ("POST", f"/v2/sandboxes/{sandbox_id}/connect", {}),
        ("POST", f"/sandboxes/{sandbox_id}/timeout", {"timeout": 5}),
        ("POST", f"/sandboxes/{sandbox_id}/refreshes", {}),
        ("GET", f"/sandboxes/{sandbox_id}/metrics", None),
    ]:
        assert_error(other_http.request(method, path, json=body), 404)

    assert detail(http, sandbox_id)["state"] == "running"
    listed = other_http.get("/v2/sandboxes").json()
    assert sandbox_id not in [item["sandboxID"] for item in listed]


@pytest.mark.parametrize(
    "headers", [{}, {"X-API-Key": "e2b_" + "2" * 40}, {"X-API-Key": ""}, {"x-api-key": "junk"}]
)
def test_a_missing_or_invalid_api_key_is_a_401(
    live_server_e2b: LiveServer, headers: dict[str, str]
) -> None:
    with httpx.Client(base_url=live_server_e2b.url, headers=headers, timeout=10) as client:
        assert_error(client.get("/v2/sandboxes"), 401)
        assert_error(client.post("/v2/sandboxes", json={"templateID": "base"}), 401)


def test_health_answers_without_an_api_key(live_server_e2b: LiveServer) -> None:
    assert httpx.get(f"{live_server_e2b.url}/health", timeout=10).status_code == 200


def test_the_api_key_header_name_is_case_insensitive(live_server_e2b: LiveServer) -> None:
    response = httpx.get(
        f"{live_server_e2b.url}/v2/sandboxes", headers={"x-api-key": live_server_e2b.api_key}
    )
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/no/such/route"),
        ("POST", "/v3/sandboxes"),
        ("GET", "/sandboxes/x/y/z"),
        ("GET", "/v2/sandboxes/"),  # E2B paths have no trailing slash; never a redirect
    ],
)
def test_an_unknown_route_is_a_json_404(http: httpx.Client, method: str, path: str) -> None:
    assert_error(http.request(method, path), 404)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v2/sandboxes"),
        ("DELETE", "/v2/sandboxes"),
        ("PATCH", "/sandboxes/{id}"),
        ("GET", "/sandboxes/{id}/pause"),
        ("GET", "/v2/sandboxes/{id}/connect"),
        ("DELETE", "/sandboxes/{id}/timeout"),
    ],
)
def test_a_wrong_method_is_a_json_405(http: httpx.Client, method: str, path: str) -> None:
    assert_error(http.request(method, path.format(id=UNKNOWN)), 405)


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"{not json", "application/json"),
        (b'["templateID", "base"]', "application/json"),
        (b"templateID=base", "text/plain"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_an_error_in_the_e2b_shape(
    http: httpx.Client, content: bytes, content_type: str
) -> None:
    response = http.post("/v2/sandboxes", content=content, headers={"Content-Type": content_type})
    assert response.status_code in (400, 415), response.text
    assert_error(response, response.status_code)
