"""What a retry with the same key gets: the original answer, byte for byte, errors
included; a different request under the same key is refused; keys are per team and never
leak into the sandbox."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import Team
from e2bfacade.runtime.local import LocalRuntime
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox
from tests.idempotency.conftest import PostFn
from tests.support.factories import TemplateFactory

pytestmark = [pytest.mark.both_databases, pytest.mark.usefixtures("runtime")]

REPLAYED = "Idempotent-Replayed"
BODY = {"templateID": "base", "timeout": 120, "metadata": {"owner": "alice"}}


def test_a_retry_replays_the_original_answer_byte_for_byte(
    post: PostFn, key: str, runtime: LocalRuntime
) -> None:
    first = post(BODY, key)
    second = post(BODY, key)

    assert first.status_code == 201, first.content
    assert REPLAYED not in first  # the original carries no marker
    assert second.status_code == 201
    assert second.content == first.content
    assert second["Content-Type"] == first["Content-Type"] == "application/json"
    assert second[REPLAYED] == "true"
    # The same sandbox, token included, and only one of it.
    assert json.loads(second.content)["envdAccessToken"] == first.json()["envdAccessToken"]
    assert Sandbox.objects.count() == 1
    assert [i.sandbox_id for i in runtime.list()] == [first.json()["sandboxID"]]
    record = IdempotencyRecord.objects.get()
    assert record.state == IdempotencyRecord.State.COMPLETED
    assert record.attempt == 1


def test_many_sequential_retries_all_replay_the_same_sandbox(
    post: PostFn, key: str, runtime: LocalRuntime
) -> None:
    first = post(BODY, key)
    replies = [post(BODY, key) for _ in range(10)]

    assert {r.content for r in replies} == {first.content}
    assert all(r[REPLAYED] == "true" for r in replies)
    assert len(runtime.list()) == 1


def test_an_equivalent_body_with_other_whitespace_and_key_order_replays(
    post: PostFn, key: str
) -> None:
    first = post('{"templateID":"base","timeout":120,"metadata":{"owner":"alice"}}', key)
    second = post(
        '{\n  "metadata" : { "owner" : "alice" },\n\t"timeout": 120,  "templateID": "base"\n}',
        key,
    )

    assert first.status_code == 201
    assert second.status_code == 201
    assert second.content == first.content
    assert second[REPLAYED] == "true"


def test_an_unknown_template_404_is_stored_and_replayed_even_once_the_template_exists(
    post: PostFn, key: str, team: Team, runtime: LocalRuntime
) -> None:
    first = post({"templateID": "not-yet-there"}, key)
    assert first.status_code == 404, first.content
    assert first.json()["code"] == 404
    assert REPLAYED not in first

    # The template appears: a retry must still get the stored answer, not run again.
    TemplateFactory.create(team=team, alias="not-yet-there")
    second = post({"templateID": "not-yet-there"}, key)

    assert second.status_code == 404
    assert second.content == first.content
    assert second["Content-Type"] == first["Content-Type"]
    assert second[REPLAYED] == "true"
    record = IdempotencyRecord.objects.get()
    assert (record.state, record.response_status) == (IdempotencyRecord.State.COMPLETED, 404)
    assert Sandbox.objects.count() == 0
    assert runtime.list() == []


def test_a_timeout_over_the_maximum_400_is_stored_and_replayed(
    post: PostFn, key: str, settings: Any, runtime: LocalRuntime
) -> None:
    settings.SANDBOX_MAX_TIMEOUT_SECONDS = 3600
    first = post({"templateID": "base", "timeout": 3601}, key)
    assert first.status_code == 400, first.content
    assert "3600" in first.json()["message"]

    settings.SANDBOX_MAX_TIMEOUT_SECONDS = 7200  # would now be allowed: still replayed
    second = post({"templateID": "base", "timeout": 3601}, key)

    assert second.status_code == 400
    assert second.content == first.content
    assert second[REPLAYED] == "true"
    assert IdempotencyRecord.objects.get().response_status == 400
    assert Sandbox.objects.count() == 0
    assert runtime.list() == []


def test_a_schema_error_is_not_recorded(post: PostFn, key: str) -> None:
    response = post({"templateID": "base", "timeout": 0}, key)

    assert response.status_code == 400
    assert IdempotencyRecord.objects.count() == 0
    # So the key is still free for the corrected request.
    assert post({"templateID": "base", "timeout": 10}, key).status_code == 201


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param({**BODY, "timeout": 121}, id="timeout"),
        pytest.param({**BODY, "metadata": {"owner": "bob"}}, id="metadata-value"),
        pytest.param({**BODY, "autoPause": True}, id="autoPause"),
        pytest.param({**BODY, "envVars": {"A": "1"}}, id="envVars"),
    ],
)
def test_the_same_key_with_a_different_request_is_a_409_mismatch(
    post: PostFn, key: str, changed: dict[str, Any], runtime: LocalRuntime
) -> None:
    first = post(BODY, key)
    mismatch = post(changed, key)

    assert mismatch.status_code == 409, mismatch.content
    body = mismatch.json()
    assert body["code"] == 409
    assert body["error_code"] == "idempotency_request_mismatch"
    assert REPLAYED not in mismatch
    # The original is untouched and still replays.
    again = post(BODY, key)
    assert again.content == first.content
    assert again[REPLAYED] == "true"
    assert len(runtime.list()) == 1


def test_the_same_key_and_body_on_the_other_create_route_is_a_mismatch(
    post: PostFn, key: str
) -> None:
    assert post(BODY, key, path="/v2/sandboxes").status_code == 201
    other = post(BODY, key, path="/sandboxes")

    assert other.status_code == 409
    assert other.json()["error_code"] == "idempotency_request_mismatch"


def test_a_key_is_scoped_to_its_team(
    post: PostFn, key: str, other_client: APIClient, other_team: Team, runtime: LocalRuntime
) -> None:
    mine = post(BODY, key)
    theirs = post(BODY, key, client=other_client)

    assert mine.status_code == theirs.status_code == 201
    assert REPLAYED not in mine and REPLAYED not in theirs
    assert mine.json()["sandboxID"] != theirs.json()["sandboxID"]
    assert IdempotencyRecord.objects.filter(key=key).count() == 2
    assert Sandbox.objects.filter(team=other_team).count() == 1
    assert len(runtime.list()) == 2


def test_the_key_never_reaches_the_sandbox(
    post: PostFn, api_client: APIClient, runtime: LocalRuntime
) -> None:
    key = "k3y-that-must-not-leak-0123456789"
    created = post({**BODY, "envVars": {"PLAIN": "value"}}, key).json()
    sandbox_id = created["sandboxID"]

    row = Sandbox.objects.get(pk=sandbox_id)
    assert row.metadata == {"owner": "alice"}
    assert row.env_vars == {"PLAIN": "value"}
    detail = api_client.get(f"/sandboxes/{sandbox_id}")
    listed = api_client.get("/v2/sandboxes")
    assert detail.status_code == 200 and listed.status_code == 200
    for response in (detail, listed):
        assert key.encode() not in response.content
    assert key.encode() not in json.dumps(created).encode()
    # Nor the runtime's record of the sandbox on the host.
    state = (runtime.root / "sandboxes" / sandbox_id / "state.json").read_bytes()
    assert key.encode() not in state
