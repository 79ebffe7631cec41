"""The Idempotency-Key header: 1-255 of a-z, 0-9 and '-', sent once. Anything else is a 400
``invalid_idempotency_key`` and leaves nothing behind: no record, no sandbox row, nothing in
the runtime."""

from __future__ import annotations

from typing import Any

import pytest

from e2bfacade.runtime.local import LocalRuntime
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox
from tests.idempotency.conftest import PostFn

pytestmark = [pytest.mark.both_databases, pytest.mark.usefixtures("runtime")]

BODY = {"templateID": "base", "timeout": 60}


@pytest.mark.parametrize(
    "bad_key",
    [
        pytest.param("", id="empty"),
        pytest.param("a" * 256, id="256-chars"),
        pytest.param("ABC-123", id="uppercase"),
        pytest.param("has space", id="space"),
        pytest.param(" leading", id="leading-space"),
        pytest.param("ключ", id="unicode"),
        pytest.param("caf\u00e9", id="latin-1"),
        pytest.param("a_b", id="underscore"),
        pytest.param("a.b", id="dot"),
        # gunicorn (and the WSGI spec) join a repeated header with commas: this is what a
        # key sent twice looks like by the time Django sees it.
        pytest.param("a,b", id="repeated-header"),
        pytest.param("same,same", id="repeated-identical-header"),
        # A trailing newline must not slip past the pattern's "$" (gunicorn would refuse the
        # header, but the key's validation should not depend on the server in front).
        pytest.param("abc\n", id="trailing-newline"),
        pytest.param("a" * 255 + "\n", id="255-chars-and-a-newline"),
    ],
)
def test_a_malformed_key_is_refused_and_nothing_is_recorded(
    post: PostFn, runtime: LocalRuntime, bad_key: str
) -> None:
    response = post(BODY, key=bad_key)

    assert response.status_code == 400, response.content
    body: dict[str, Any] = response.json()
    assert body["code"] == 400
    assert body["error_code"] == "invalid_idempotency_key"
    assert body["message"]
    assert IdempotencyRecord.objects.count() == 0
    assert Sandbox.objects.count() == 0
    assert runtime.list() == []


def test_a_malformed_key_is_refused_on_the_v1_route_too(post: PostFn) -> None:
    response = post(BODY, key="NOPE", path="/sandboxes")

    assert response.status_code == 400
    assert response.json()["error_code"] == "invalid_idempotency_key"
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.parametrize(
    "good_key",
    [
        pytest.param("a" * 255, id="255-chars"),
        pytest.param("0", id="one-char"),
        pytest.param("-", id="just-a-dash"),
        pytest.param("3f2a9c1e-8d4b-4e7a-9f10-2b6c5d8e7a01", id="uuid"),
    ],
)
def test_a_key_at_the_edges_of_the_format_is_accepted(post: PostFn, good_key: str) -> None:
    response = post(BODY, key=good_key)

    assert response.status_code == 201, response.content
    record = IdempotencyRecord.objects.get()
    assert record.key == good_key
    assert record.resource_id == response.json()["sandboxID"]
