"""Hostile bodies and ids: each a clear 4xx in E2B's error shape, and nothing written."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.parsers import MAX_DEPTH
from e2bfacade.runtime.local import LocalRuntime
from sandboxes.models import Sandbox


def post_raw(
    client: APIClient, path: str, raw: bytes | str, content_type: str = "application/json"
) -> dict[str, Any]:
    response = client.generic("POST", path, raw, content_type=content_type)  # type: ignore[arg-type]  # DRF accepts bytes; its stubs say str
    body = response.json()
    assert body["code"] == response.status_code, body
    assert 400 <= response.status_code < 500, body
    return {"status": response.status_code, **body}


def assert_nothing_created(runtime: LocalRuntime) -> None:
    assert not Sandbox.objects.exists()
    assert runtime.list() == []


def test_a_body_over_one_mebibyte_is_a_413(api_client: APIClient, runtime: LocalRuntime) -> None:
    raw = json.dumps({"templateID": "base", "metadata": {"a": "x" * (1024 * 1024)}})

    answer = post_raw(api_client, "/v2/sandboxes", raw)

    assert answer["status"] == 413
    assert_nothing_created(runtime)


def test_json_nested_past_the_documented_depth_is_a_400(
    api_client: APIClient, runtime: LocalRuntime
) -> None:
    raw = '{"templateID": "base", "network": ' + "[" * 5000 + "]" * 5000 + "}"

    answer = post_raw(api_client, "/v2/sandboxes", raw)

    assert answer["status"] == 400 and "nested" in answer["message"]
    assert_nothing_created(runtime)


def test_json_exactly_at_the_depth_limit_is_parsed(api_client: APIClient) -> None:
    # depth 1 is the body object itself; the deepest array sits at MAX_DEPTH.
    raw = '{"templateID": "nope", "zzz": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"

    answer = post_raw(api_client, "/v2/sandboxes", raw)

    assert answer["status"] == 404  # parsed, then the unknown template is the answer


def test_duplicate_json_keys_are_refused(api_client: APIClient, runtime: LocalRuntime) -> None:
    answer = post_raw(api_client, "/v2/sandboxes", '{"templateID": "base", "templateID": "base"}')

    assert answer["status"] == 400 and "duplicate" in answer["message"]
    assert_nothing_created(runtime)


@pytest.mark.parametrize(
    "raw",
    [b'{"templateID": "\xff\xfe"}', b'{"templateID": "base", "timeout": NaN}', b"{", b"", b"null"],
)
def test_malformed_bodies_are_a_400(
    api_client: APIClient, runtime: LocalRuntime, raw: bytes
) -> None:
    answer = post_raw(api_client, "/v2/sandboxes", raw)

    assert answer["status"] == 400
    assert_nothing_created(runtime)


def test_a_wrong_content_type_is_a_415(api_client: APIClient, runtime: LocalRuntime) -> None:
    answer = post_raw(
        api_client, "/v2/sandboxes", '{"templateID": "base"}', content_type="text/plain"
    )

    assert answer["status"] == 415
    assert_nothing_created(runtime)


@pytest.mark.parametrize(
    "metadata",
    [
        {"k": 1},
        {"k": None},
        {"k": ["a"]},
        {str(i): "v" for i in range(101)},
        {"": "v"},
        {"k" * 257: "v"},
    ],
)
def test_non_string_or_oversized_metadata_is_a_400(
    api_client: APIClient, runtime: LocalRuntime, metadata: dict[str, Any]
) -> None:
    answer = post_raw(
        api_client, "/v2/sandboxes", json.dumps({"templateID": "base", "metadata": metadata})
    )

    assert answer["status"] == 400 and "metadata" in answer["message"]
    assert_nothing_created(runtime)


def test_unicode_everywhere_is_kept_or_refused_cleanly(
    api_client: APIClient, runtime: LocalRuntime
) -> None:
    metadata = {"ключ": "значение 🚀", "e\u0301": "\u202e"}
    created = api_client.post(
        "/v2/sandboxes", {"templateID": "base", "metadata": metadata}, format="json"
    )
    assert created.status_code == 201
    sandbox_id = created.json()["sandboxID"]

    assert api_client.get(f"/sandboxes/{sandbox_id}").json()["metadata"] == metadata
    assert (
        post_raw(api_client, "/v2/sandboxes", json.dumps({"templateID": "базовый"}))["status"]
        == 404
    )
    nul = post_raw(
        api_client, "/v2/sandboxes", json.dumps({"templateID": "base", "metadata": {"a": "\x00"}})
    )
    assert nul["status"] == 400


@pytest.mark.parametrize("sandbox_id", ["..%2F..%2Fetc", "x" * 10_000, "%F0%9F%9A%80", "a%2Fb"])
def test_hostile_sandbox_ids_are_a_404_in_shape(api_client: APIClient, sandbox_id: str) -> None:
    for method, suffix in [("GET", ""), ("DELETE", ""), ("POST", "/pause"), ("POST", "/connect")]:
        response = api_client.generic(method, f"/sandboxes/{sandbox_id}{suffix}")
        assert response.status_code == 404, (method, suffix, response.content[:200])
        assert response.json()["code"] == 404


@pytest.mark.parametrize(
    "path",
    [
        "/sandboxes/a%00b",
        "/sandboxes/a%00b/pause",
        "/templates/a%00b",
        "/snapshots?sandboxID=a%00b",
        "/v2/sandboxes?metadata=a%3D%00",
        "/v2/sandboxes?template=%00",
    ],
)
def test_a_nul_byte_anywhere_in_the_url_is_a_400(api_client: APIClient, path: str) -> None:
    for method in ("GET", "POST", "DELETE"):
        response = api_client.generic(method, path)
        assert response.status_code == 400, (method, path, response.content[:200])
        assert response.json() == {"code": 400, "message": "NUL bytes are not allowed in URLs"}
