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

pytestmark = pytest.mark.django_db


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
