"""Sandbox reads that are more than a filter: the paged, filtered list."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

from django.db import connection
from django.db.models import Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils.dateparse import parse_datetime

from e2bfacade.errors import BadRequest
from e2bfacade.paging import make_token, read_token
from sandboxes.models import CLIENT_ID, Sandbox

State = Sandbox.State
WIRE_TO_STATES = {
    "running": [State.RUNNING, State.RESUMING],
    "paused": [State.PAUSED, State.PAUSING],
}
TOKEN_SALT = "e2bfacade.sandbox-list"


@dataclass(frozen=True)
class ListQuery:
    states: tuple[str, ...] = ("running", "paused")
    metadata: tuple[tuple[str, str], ...] = ()
    order: str = "desc"
    started_after: datetime | None = None
    template: str | None = None
    limit: int = 100
    next_token: str | None = None


def parse_metadata_filter(raw: str | None) -> tuple[tuple[str, str], ...]:
    """E2B sends the metadata filter as one parameter holding ``k=v&k2=v2``."""
    if not raw:
        return ()
    try:
        pairs = parse_qsl(raw, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise BadRequest(
            f"metadata filter {raw!r} is not of the form key=value&key2=value2"
        ) from None
    # Both SDKs percent-encode each key and value before form-encoding the whole filter, so
    # after parse_qsl they are still encoded once.
    return tuple((unquote(k), unquote(v)) for k, v in pairs)


def parse_list_query(params: dict[str, str], *, paged: bool = True) -> ListQuery:
    states: tuple[str, ...] = ("running", "paused")
    if params.get("state"):
        states = tuple(s.strip() for s in params["state"].split(",") if s.strip())
        bad = [s for s in states if s not in WIRE_TO_STATES]
        if bad:
            raise BadRequest(f"state must be running and/or paused, got {', '.join(bad)}")
    order = params.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise BadRequest(f"order must be asc or desc, got {order!r}")
    started_after = None
    if params.get("startedAfter"):
        try:
            started_after = parse_datetime(params["startedAfter"].replace(" ", "+"))
            if started_after is None or started_after.tzinfo is None:
                raise ValueError
            # In UTC: PostgreSQL refuses offsets beyond +-15:59, which RFC 3339 allows.
            started_after = started_after.astimezone(UTC)
        except (ValueError, OverflowError):
            message = "startedAfter must be an RFC 3339 timestamp with a time zone"
            raise BadRequest(message) from None
    limit = 100
    if paged and params.get("limit") not in (None, ""):
        try:
            limit = int(params["limit"])
        except ValueError:
            raise BadRequest("limit must be an integer from 1 to 100") from None
        if not 1 <= limit <= 100:
            raise BadRequest("limit must be an integer from 1 to 100")
    return ListQuery(
        states=states,
        metadata=parse_metadata_filter(params.get("metadata")),
        order=order,
        started_after=started_after,
        template=params.get("template") or None,
        limit=limit,
        next_token=(params.get("nextToken") or None) if paged else None,
    )


def _filtered(team_id: int, query: ListQuery) -> QuerySet[Sandbox]:
    """The team's sandboxes that ``query`` selects, before paging and order."""
    qs: QuerySet[Sandbox] = Sandbox.objects.of_team(team_id).filter(
        state__in=[s for wire in query.states for s in WIRE_TO_STATES[wire]]
    )
    for i, (key, value) in enumerate(query.metadata):
        # Cast: compared bare, SQLite would parse the value as JSON.
        value_of_key = Cast(KeyTextTransform(key, "metadata"), TextField())
        qs = qs.annotate(**{f"_m{i}": value_of_key}).filter(**{f"_m{i}": value})
    if query.started_after is not None:
        qs = qs.filter(started_at__gte=query.started_after)  # "at or after", as E2B says
    if query.template:
        qs = qs.filter(Q(template_id=query.template) | Q(template__alias=query.template))
    return qs


def _ordering(query: ListQuery) -> list[str]:
    if query.order == "desc":
        return ["-started_at", "-sandbox_id"]
    return ["started_at", "sandbox_id"]


def sandbox_list_all(
    *, team_id: int, query: ListQuery, columns: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The ``columns`` of every sandbox ``query`` selects, in the list's order, in one query
    (the v1 list, which has no paging)."""
    return list(_filtered(team_id, query).order_by(*_ordering(query)).values(*columns))


def sandbox_list(*, team_id: int, query: ListQuery) -> tuple[list[Sandbox], str | None]:
    """One page of the team's sandboxes and the token of the next page (None when last).

    Keyset paging on (startedAt, sandboxID): stable while sandboxes come and go. Tokens are
    signed, so a forged or altered token is a 400, never a peek at other rows.
    """
    qs = _filtered(team_id, query)
    desc = query.order == "desc"
    filters = [query.states, query.metadata, query.order, query.started_after, query.template]
    if query.next_token:
        started_at, last_id = read_token(query.next_token, salt=TOKEN_SALT, filters=filters)
        if desc:
            qs = qs.filter(
                Q(started_at__lt=started_at) | Q(started_at=started_at, sandbox_id__lt=last_id)
            )
        else:
            qs = qs.filter(
                Q(started_at__gt=started_at) | Q(started_at=started_at, sandbox_id__gt=last_id)
            )
    rows = list(qs.order_by(*_ordering(query))[: query.limit + 1])
    next_token = None
    if len(rows) > query.limit:
        rows = rows[: query.limit]
        next_token = make_token(
            salt=TOKEN_SALT, at=rows[-1].started_at, pk=rows[-1].sandbox_id, filters=filters
        )
    return rows, next_token


def _utc_text(column: str) -> str:
    """SQL rendering a timestamp column as DRF renders a datetime: ISO 8601 in UTC with a
    "Z", the microseconds only when there are any (Python's ``isoformat``)."""
    at = f"{column} AT TIME ZONE 'UTC'"
    return (
        f"CASE WHEN date_trunc('second', {column}) = {column} "
        f'THEN to_char({at}, \'YYYY-MM-DD"T"HH24:MI:SS"Z"\') '
        f'ELSE to_char({at}, \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\') END'
    )


def sandbox_list_all_json(*, team_id: int, query: ListQuery) -> str | None:
    """The v1 list's whole JSON body built by PostgreSQL in the query that selects it (one
    aggregate; no row or value crosses into Python): what ``listed_values`` of
    :func:`sandbox_list_all` renders, as JSON (``tests/api/test_list_rendering.py`` holds
    the two equal). Metadata goes as stored: its values are strings (the create's
    StringMapField), which ``listed_values`` only restates. None off PostgreSQL, where the
    caller renders the rows.

    The rows come from the list's own query (its filters and order, as Django compiles
    them) and are aggregated in that order: a sorted subquery feeds ``json_agg`` in order
    (json_agg has no partial form, so the planner cannot split it across workers). A
    record, not ``json_build_object``, is what it aggregates: rendered compact, a quarter
    faster."""
    if connection.vendor != "postgresql":
        return None
    columns = [*("template_id", "sandbox_id", "alias", "started_at", "end_at", "cpu_count")]
    columns += ("memory_mb", "disk_size_mb", "state", "envd_version", "metadata")
    rows = _filtered(team_id, query).order_by(*_ordering(query)).values(*columns)
    inner, inner_params = rows.query.sql_with_params()
    states = " ".join("WHEN %s THEN %s" for _ in Sandbox.WIRE_STATE)
    sql = f"""
        SELECT coalesce(json_agg(x), '[]')::text FROM (
            SELECT r.template_id AS "templateID", r.sandbox_id AS "sandboxID",
                %s::text AS "clientID", r.alias AS "alias",
                {_utc_text("r.started_at")} AS "startedAt", {_utc_text("r.end_at")} AS "endAt",
                r.cpu_count AS "cpuCount", r.memory_mb AS "memoryMB",
                r.disk_size_mb AS "diskSizeMB", CASE r.state {states} END AS "state",
                r.envd_version AS "envdVersion", coalesce(r.metadata, '{{}}'::jsonb) AS "metadata"
            FROM ({inner}) AS r
        ) AS x"""
    wire = [x for state, name in Sandbox.WIRE_STATE.items() for x in (str(state), name)]
    with connection.cursor() as cursor:
        cursor.execute(sql, [CLIENT_ID, *wire, *inner_params])
        return str(cursor.fetchone()[0])
