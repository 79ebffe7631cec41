"""How many SQL statements the hot requests make (the hot path's budget): a regression here is a
round trip added to every create or replay. Counted with Django's query capture through
the real views and the real runtime. Inside the test's own transaction each ``atomic``
block shows as a SAVEPOINT and its RELEASE, as BEGIN and COMMIT cost in production.

On PostgreSQL a keyed create also takes and frees the record's advisory lock, in the
record's INSERT and its completing UPDATE: no statement of their own."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

pytestmark = pytest.mark.both_databases

BODY = {"templateID": "base", "timeout": 600}


def _statements(client: APIClient, path: str, **headers: str) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        response = client.post(path, BODY, format="json", **headers)  # type: ignore[arg-type]
    assert response.status_code == 201, response.content
    return len(captured.captured_queries), [q["sql"][:80] for q in captured.captured_queries]


def test_creates_and_a_replay_make_no_more_statements_than_budgeted(
    api_client: APIClient,
) -> None:
    api_client.get("/v2/sandboxes")  # the API key is resolved (and cached) before we count
    # rate-limit upsert; BEGIN; template (locked); team (locked); live count; INSERT; COMMIT;
    # the guarded UPDATE to running; its log entry's INSERT and the log's trim; the team's
    # start counted (one upsert)
    unkeyed, sql = _statements(api_client, "/v2/sandboxes")
    assert unkeyed <= 11, sql
    key = {"HTTP_IDEMPOTENCY_KEY": f"budget-{uuid.uuid4().hex}"}
    # + the replay read that misses, the record's INSERT and its completing UPDATE
    keyed, sql = _statements(api_client, "/v2/sandboxes", **key)
    assert keyed <= 14, sql
    # rate-limit upsert; the record read, answered from it
    replay, sql = _statements(api_client, "/v2/sandboxes", **key)
    assert replay <= 2, sql
