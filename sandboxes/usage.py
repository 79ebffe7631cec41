"""Team metrics (E2B's ``GET /teams/{teamID}/metrics`` and ``/metrics/max``): how many of a
team's sandboxes were live at once, and how many started per second, over time.

Recorded as the service runs, never recomputed from the sandbox rows on a read: a start
adds one to its step's ``started`` (and raises its ``concurrent`` to the team's live count
then), and the lifecycle worker samples every team's live count each few seconds
(:func:`team_metrics_sample`, one grouped query for all teams). A step is
``TEAM_METRICS_STEP_SECONDS`` long, one row per team and step (``TeamMetricSample``);
``concurrent`` only ever rises within a step (the most seen), so any number of workers may
sample at once. Rows older than ``TEAM_METRICS_RETENTION_SECONDS`` are purged by the worker.
A read aggregates the rows of its interval in the database, into at most
:data:`POINTS_MAX` points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Max, Sum

from e2bfacade.errors import BadRequest, Forbidden
from e2bfacade.models import Team
from sandboxes.models import Sandbox, TeamMetricSample

# The most points a read answers: a wider interval is read in coarser steps.
POINTS_MAX = 1000
# The interval a read covers when it names no start: the last hour.
DEFAULT_SPAN_SECONDS = 3600
METRICS = ("concurrent_sandboxes", "sandbox_start_rate")


def _step_of(at: int) -> int:
    step: int = settings.TEAM_METRICS_STEP_SECONDS
    return at - at % step


_TABLE = TeamMetricSample._meta.db_table
# One statement a sample: the step's row is made or updated (the unique constraint
# arbitrates two writers); ``concurrent`` only rises, ``started`` adds up. {live} is the
# team's live count: a parameter, or a count of its rows (a start's, in the same statement).
_UPSERT = f"""
INSERT INTO {_TABLE} (team_id, at, concurrent, started) VALUES (%s, %s, {{live}}, %s)
ON CONFLICT (team_id, at) DO UPDATE SET
    started = {_TABLE}.started + excluded.started,
    concurrent = CASE WHEN excluded.concurrent > {_TABLE}.concurrent
        THEN excluded.concurrent ELSE {_TABLE}.concurrent END
"""
_LIVE_COUNT = (
    f"(SELECT COUNT(*) FROM {Sandbox._meta.db_table} WHERE team_id = %s "
    f"AND state NOT IN ('{Sandbox.State.KILLED}', '{Sandbox.State.CREATING}'))"
)


def team_metrics_started(*, team_id: int, now: datetime) -> None:
    """Count a sandbox of the team that has just started (its create answered running),
    and the team's live sandboxes then: one statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            _UPSERT.format(live=_LIVE_COUNT),
            [team_id, _step_of(int(now.timestamp())), team_id, 1],
        )


def team_metrics_sample(*, now: datetime) -> int:
    """Record every team's live sandboxes in the current step (the lifecycle worker's,
    every few ticks): one grouped count, one statement per team that has any. Returns how
    many teams had any."""
    at = _step_of(int(now.timestamp()))
    counts = Sandbox.objects.live().values("team_id").annotate(n=Count("pk")).order_by()
    rows = [(row["team_id"], at, row["n"], 0) for row in counts]
    if rows:
        with connection.cursor() as cursor:
            cursor.executemany(_UPSERT.format(live="%s"), rows)
    return len(rows)


def team_metrics_purge(*, now: datetime) -> int:
    """Delete the samples older than the retention. Returns how many."""
    cutoff = int(now.timestamp()) - settings.TEAM_METRICS_RETENTION_SECONDS
    deleted, _ = TeamMetricSample.objects.filter(at__lt=cutoff).delete()
    return deleted


# --------------------------------------------------------------------------------- read
def check_team(team: Team, team_id: str) -> None:
    """The path's team must be the caller's: E2B answers another team's with a 403."""
    if team_id != str(team.pk):
        raise Forbidden(f"You are not allowed to access team '{team_id[:64]}'")


@dataclass(frozen=True)
class Interval:
    start: int  # unix seconds, inclusive
    end: int  # unix seconds, inclusive
    step: int  # seconds per point


def parse_interval(params: dict[str, str], now: datetime) -> Interval:
    """``start`` and ``end`` (unix seconds; defaults: the last hour up to now), and the step
    that keeps the answer within :data:`POINTS_MAX` points."""
    values = {}
    for name in ("start", "end"):
        raw = params.get(name)
        if raw is None or raw == "":
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            raise BadRequest(f"'{name}' must be an integer, got '{raw[:64]}'") from None
        if values[name] < 0:
            raise BadRequest(f"'{name}' must be at least 0, got {values[name]}")
    end = values.get("end", int(now.timestamp()))
    start = values.get("start", max(0, end - DEFAULT_SPAN_SECONDS))
    if start > end:
        raise BadRequest(f"'start' ({start}) must not be after 'end' ({end})")
    base: int = settings.TEAM_METRICS_STEP_SECONDS
    step = base * max(1, math.ceil((end - start + 1) / base / POINTS_MAX))
    return Interval(start - start % step, end, step)


def _points(team: Team, interval: Interval) -> dict[int, tuple[int, int]]:
    """(most live, started) per point of the interval that has samples: one grouped query."""
    rows = (
        TeamMetricSample.objects.filter(
            team_id=team.pk, at__gte=interval.start, at__lte=interval.end
        )
        .annotate(point=F("at") - F("at") % interval.step)
        .values("point")
        .annotate(concurrent=Max("concurrent"), started=Sum("started"))
        .order_by("point")
    )
    return {int(r["point"]): (int(r["concurrent"]), int(r["started"])) for r in rows}


def _wire_time(at: int) -> dict[str, object]:
    return {
        "timestamp": datetime.fromtimestamp(at, tz=UTC).isoformat().replace("+00:00", "Z"),
        "timestampUnix": at,
    }


def team_metrics(*, team: Team, interval: Interval) -> list[dict[str, object]]:
    """E2B's ``TeamMetric`` for every point of the interval (a point without samples: no
    sandbox was live nor started then, as far as the service recorded)."""
    points = _points(team, interval)
    out = []
    for at in range(interval.start, interval.end + 1, interval.step):
        concurrent, started = points.get(at, (0, 0))
        out.append(
            {
                **_wire_time(at),
                "concurrentSandboxes": concurrent,
                "sandboxStartRate": started / interval.step,
            }
        )
    return out


def team_metrics_max(*, team: Team, interval: Interval, metric: str) -> dict[str, object]:
    """E2B's ``MaxTeamMetric``: the largest value of ``metric`` in the interval and when
    (the first point it was reached; none recorded: 0 at the interval's start)."""
    if metric not in METRICS:
        raise BadRequest(f"'metric' must be one of {', '.join(METRICS)}, got '{metric[:64]}'")
    best_at, best = interval.start, 0.0
    for at, (concurrent, started) in sorted(_points(team, interval).items()):
        value = concurrent if metric == "concurrent_sandboxes" else started / interval.step
        if value > best:
            best_at, best = at, float(value)
    return {**_wire_time(best_at), "value": best}
