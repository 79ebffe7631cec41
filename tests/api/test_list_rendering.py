"""The lists render rows with ``listed_rows`` / ``listed_values`` (no field object per value);
the schema and every other answer use ``ListedSandboxSerializer``. They must render the same
bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from rest_framework.renderers import JSONRenderer

from e2bfacade.models import Team
from sandboxes.models import Sandbox
from sandboxes.serializers import (
    LISTED_COLUMNS,
    ListedSandboxSerializer,
    listed_rows,
    listed_values,
)
from tests.support.factories import SandboxFactory

pytestmark = [pytest.mark.both_databases, pytest.mark.django_db]


def test_listed_rows_renders_what_the_serializer_renders(team: Team) -> None:
    plus_two = timezone(timedelta(hours=2))
    rows = [
        SandboxFactory.create(team=team, state=Sandbox.State.RUNNING, metadata={}),
        SandboxFactory.create(
            team=team,
            state=Sandbox.State.PAUSED,
            metadata={"ünï": "cødé", "n": "1", "empty": ""},
            started_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
            end_at=datetime(2026, 1, 2, 5, 4, 5, tzinfo=plus_two),
        ),
        SandboxFactory.create(team=team, state=Sandbox.State.PAUSING, alias="x"),
        SandboxFactory.create(team=team, state=Sandbox.State.RESUMING),
    ]
    rows = list(Sandbox.objects.filter(pk__in=[r.pk for r in rows]).order_by("sandbox_id"))
    # The stubs do not model many=True.
    expected: Any = ListedSandboxSerializer(rows, many=True).data  # type: ignore[arg-type]
    assert listed_rows(rows) == expected
    # The v1 list renders straight from column values.
    columns = Sandbox.objects.filter(pk__in=[r.pk for r in rows]).order_by("sandbox_id")
    assert listed_values(columns.values(*LISTED_COLUMNS)) == expected
    renderer = JSONRenderer()
    assert renderer.render(listed_rows(rows)) == renderer.render(expected)
    [dated] = [r for r in json.loads(renderer.render(listed_rows(rows))) if r["metadata"].get("n")]
    assert dated["startedAt"] == "2026-01-02T03:04:05.678901Z"
    assert dated["endAt"] == "2026-01-02T03:04:05Z"  # in UTC, as DRF renders it


def test_the_v1_list_body_postgresql_builds_is_what_the_serializer_renders(team: Team) -> None:
    from django.db import connection

    from sandboxes import selectors

    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL builds the v1 list's body in its query")
    plus_two = timezone(timedelta(hours=2))
    made = [
        SandboxFactory.create(team=team, state=Sandbox.State.RUNNING, metadata={}),
        SandboxFactory.create(
            team=team,
            state=Sandbox.State.RUNNING,
            metadata={"ünï": 'cødé "q" \\ \n\t\x01', "n": "1", "empty": "", "a": "2"},
            started_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
            end_at=datetime(2026, 1, 2, 5, 4, 5, tzinfo=plus_two),
        ),
        SandboxFactory.create(
            team=team,
            state=Sandbox.State.RESUMING,
            alias="x",
            started_at=datetime(2026, 1, 2, 3, 4, 5, 10, tzinfo=UTC),
        ),
        SandboxFactory.create(team=team, state=Sandbox.State.PAUSED),  # not in the v1 list
        SandboxFactory.create(state=Sandbox.State.RUNNING),  # another team's
    ]
    for query in (
        selectors.parse_list_query({"state": "running"}, paged=False),
        selectors.parse_list_query({"state": "running", "order": "asc"}, paged=False),
        selectors.parse_list_query({"state": "running", "metadata": "n=1"}, paged=False),
        selectors.parse_list_query({"state": "running", "metadata": "n=2"}, paged=False),
    ):
        rows = selectors.sandbox_list_all(team_id=team.pk, query=query, columns=LISTED_COLUMNS)
        body = selectors.sandbox_list_all_json(team_id=team.pk, query=query)
        assert body is not None
        assert json.loads(body) == listed_values(rows), query
    for order in ("desc", "asc"):
        everything = selectors.parse_list_query({"state": "running", "order": order}, paged=False)
        body = selectors.sandbox_list_all_json(team_id=team.pk, query=everything)
        assert [r["sandboxID"] for r in json.loads(body or "")] == [
            r.sandbox_id
            for r in sorted(
                made[:3], key=lambda r: (r.started_at, r.sandbox_id), reverse=order == "desc"
            )
        ]
