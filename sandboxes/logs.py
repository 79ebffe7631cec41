"""A sandbox's logs (E2B's ``GET /sandboxes/{id}/logs`` and ``/v2/...``): what its owner needs
to debug it — the lifecycle events the service records where it learns of them (created,
paused and why, resumed or cold-booted, timed out, killed, kept after a crash, lost, a
failed resume) and what its template's start and ready commands wrote while it booted (the
runtime keeps that bounded: ``e2bfacade.runtime.start``).

Bounded per sandbox: at most ``SANDBOX_LOG_MAX_ENTRIES`` entries and
``SANDBOX_LOG_MAX_BYTES`` bytes, the oldest dropped first; a message is cut at
:data:`MESSAGE_MAX` bytes. A batch is cut to the bounds before it is written, so however much
a guest writes, no more than the bounds ever reaches the database. Entries of a killed
sandbox are kept ``SANDBOX_LOG_RETENTION_SECONDS`` after its kill, then purged by the
lifecycle worker. Every entry belongs to one sandbox row, hence to one team: a read names
the team, and another team's sandbox is a 404.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from e2bfacade.errors import BadRequest
from e2bfacade.models import Team
from e2bfacade.runtime.base import ConsoleLine, SandboxRuntimeError, Stream
from nodes.selectors import local_runtime
from sandboxes.models import Sandbox, SandboxLogEntry
from sandboxes.transitions import not_found

logger = logging.getLogger(__name__)

Level = SandboxLogEntry.Level
LEVELS = [Level.DEBUG, Level.INFO, Level.WARN, Level.ERROR]  # E2B's order, least first
MESSAGE_MAX = 4096
LIFECYCLE = "lifecycle"
# E2B's largest page (v2's ``limit`` maximum; v1's default).
PAGE_MAX = 1000
SEARCH_MAX = 256


@dataclass(frozen=True)
class LogLine:
    """An entry to record (``fields`` are strings, as E2B's ``SandboxLogEntry.fields``)."""

    timestamp: datetime
    level: str
    logger: str
    message: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.message.encode()) + sum(len(k) + len(v) for k, v in self.fields.items())


def _cut(text: str) -> str:
    raw = text.encode(errors="replace")
    return text if len(raw) <= MESSAGE_MAX else raw[:MESSAGE_MAX].decode(errors="ignore")


# -------------------------------------------------------------------------------- write
def sandbox_log_append(*, sandbox_id: str, lines: Sequence[LogLine]) -> int:
    """Record ``lines`` for the sandbox, then drop its oldest entries past the bounds: two
    statements, no transaction and no lock a transition would wait on. Returns how many
    were written. The sandbox's row must exist (it does wherever its events happen: a row
    is deleted only while it is being created)."""
    max_entries = settings.SANDBOX_LOG_MAX_ENTRIES
    max_bytes = settings.SANDBOX_LOG_MAX_BYTES
    # The newest that fit: a flood is cut here, before anything reaches the database.
    kept: list[LogLine] = []
    total = 0
    for line in reversed(lines):
        line = LogLine(
            line.timestamp,
            line.level,
            line.logger,
            _cut(line.message),
            {k[:64]: _cut(v)[:256] for k, v in list(line.fields.items())[:16]},
        )
        if len(kept) >= max_entries or total + line.size > max_bytes:
            break
        kept.append(line)
        total += line.size
    if not kept:
        return 0
    SandboxLogEntry.objects.bulk_create(
        SandboxLogEntry(
            sandbox_id=sandbox_id,
            timestamp=line.timestamp,
            level=line.level,
            logger=line.logger,
            message=line.message,
            fields=line.fields,
            size=line.size,
        )
        for line in reversed(kept)
    )
    # Then one statement drops what no longer fits, newest first: past the count, or past
    # the bytes once added up. Between the two the sandbox may hold one batch more than the
    # bounds, never a guest's flood (the batch was cut above).
    with connection.cursor() as cursor:
        cursor.execute(_TRIM, [sandbox_id, max_entries, max_bytes])
    return len(kept)


_TABLE = SandboxLogEntry._meta.db_table
_TRIM = f"""
DELETE FROM {_TABLE} WHERE id IN (
    SELECT id FROM (
        SELECT id,
            ROW_NUMBER() OVER newest AS n,
            SUM(size) OVER (newest ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS total
        FROM {_TABLE} WHERE sandbox_id = %s
        WINDOW newest AS (ORDER BY "timestamp" DESC, id DESC)
    ) AS ranked WHERE n > %s OR total > %s
)
"""


def sandbox_log_event(
    sandbox_id: str, message: str, *, level: str = Level.INFO, event: str, **fields: str
) -> None:
    """Record one lifecycle event (``event``: created, paused, resumed, killed, ...)."""
    sandbox_log_append(
        sandbox_id=sandbox_id,
        lines=[
            LogLine(timezone.now(), level, LIFECYCLE, message, {"event": event, **fields}),
        ],
    )


def console_lines(lines: Sequence[ConsoleLine]) -> list[LogLine]:
    """The runtime's start and ready output as log entries: standard output at ``info``,
    standard error at ``error`` (as envd logs a start command's)."""
    return [
        LogLine(
            datetime.fromtimestamp(line.at, tz=UTC),
            Level.ERROR if line.stream is Stream.STDERR else Level.INFO,
            line.source,
            line.text,
            {"stream": str(line.stream)},
        )
        for line in lines
    ]


def sandbox_log_boot(*, sandbox_id: str, message: str, event: str, level: str = Level.INFO) -> None:
    """Record what the template's start and ready commands wrote during the sandbox's boot
    (read from the runtime: no transaction may be held), then the event itself, so its
    output reads before it. A runtime that cannot say is logged, not raised."""
    try:
        output = local_runtime().start_output(sandbox_id)
    except (SandboxRuntimeError, OSError) as exc:
        logger.warning("sandbox %s: its start output could not be read: %s", sandbox_id, exc)
        output = []
    lines = console_lines(output)
    lines.append(LogLine(timezone.now(), level, LIFECYCLE, message, {"event": event}))
    sandbox_log_append(sandbox_id=sandbox_id, lines=lines)


def sandbox_log_purge(*, now: datetime) -> int:
    """Delete the logs of sandboxes killed more than the retention ago. Returns how many
    entries went."""
    cutoff = now - timedelta(seconds=settings.SANDBOX_LOG_RETENTION_SECONDS)
    deleted, _ = SandboxLogEntry.objects.filter(
        sandbox__state=Sandbox.State.KILLED, sandbox__killed_at__lt=cutoff
    ).delete()
    return deleted


# --------------------------------------------------------------------------------- read
@dataclass(frozen=True)
class LogQuery:
    """A validated logs query: entries from ``cursor`` (ms since the epoch) on, or back to
    it (``backward``, newest first), at least ``level``, containing ``search``."""

    cursor: int | None = None
    limit: int = PAGE_MAX
    backward: bool = False
    level: str | None = None
    search: str | None = None


def _int(params: dict[str, str], name: str, low: int, high: int | None) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"'{name}' must be an integer, got '{raw[:64]}'") from None
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise BadRequest(f"'{name}' must be {bounds}, got {value}")
    return value


def parse_v1_query(params: dict[str, str]) -> LogQuery:
    """``start`` (ms) and ``limit`` (default 1000), as E2B's v1 route takes them."""
    limit = _int(params, "limit", 0, None)
    return LogQuery(
        cursor=_int(params, "start", 0, None),
        limit=PAGE_MAX if limit is None else min(limit, PAGE_MAX),
    )


def parse_v2_query(params: dict[str, str]) -> LogQuery:
    """``cursor`` (ms), ``limit`` (0-1000, default 1000), ``direction`` (forward,
    backward), ``level`` (the least to return) and ``search`` (a case-sensitive substring,
    at most 256 characters)."""
    limit = _int(params, "limit", 0, PAGE_MAX)
    direction = params.get("direction") or "forward"
    if direction not in ("forward", "backward"):
        raise BadRequest(f"'direction' must be forward or backward, got '{direction[:64]}'")
    level = params.get("level") or None
    if level is not None and level not in LEVELS:
        raise BadRequest(f"'level' must be one of {', '.join(LEVELS)}, got '{level[:64]}'")
    search = params.get("search")
    if search is not None and len(search) > SEARCH_MAX:
        raise BadRequest(f"'search' must be at most {SEARCH_MAX} characters")
    return LogQuery(
        cursor=_int(params, "cursor", 0, None),
        limit=PAGE_MAX if limit is None else limit,
        backward=direction == "backward",
        level=level,
        search=search or None,
    )


def _readable(team: Team, sandbox_id: str, now: datetime) -> Sandbox:
    """The team's sandbox whose logs may be read: live, or killed within the retention
    (another team's, or one purged: 404, in E2B's words)."""
    cutoff = now - timedelta(seconds=settings.SANDBOX_LOG_RETENTION_SECONDS)
    sandbox = (
        Sandbox.objects.of_team(team.pk)
        .filter(pk=sandbox_id)
        .exclude(state=Sandbox.State.CREATING)
        .exclude(state=Sandbox.State.KILLED, killed_at__lt=cutoff)
        .first()
    )
    if sandbox is None:
        raise not_found(sandbox_id)
    return sandbox


def sandbox_log_read(*, team: Team, sandbox_id: str, query: LogQuery) -> list[SandboxLogEntry]:
    """The team's sandbox's entries as ``query`` asks, in the order it asks (two queries:
    the sandbox's ownership, then one indexed range of its entries)."""
    now = timezone.now()
    _readable(team, sandbox_id, now)
    if query.limit == 0:
        return []
    entries: QuerySet[SandboxLogEntry] = SandboxLogEntry.objects.filter(sandbox_id=sandbox_id)
    if query.level is not None:
        entries = entries.filter(level__in=LEVELS[LEVELS.index(Level(query.level)) :])
    if query.search is not None:
        entries = entries.filter(message__contains=query.search)
    if query.backward:
        if query.cursor is not None:
            entries = entries.filter(timestamp__lte=_from_ms(query.cursor))
        entries = entries.order_by("-timestamp", "-id")
    else:
        if query.cursor is not None:
            entries = entries.filter(timestamp__gte=_from_ms(query.cursor))
        entries = entries.order_by("timestamp", "id")
    return list(entries[: query.limit])


def _from_ms(ms: int) -> datetime:
    # A cursor past any date Python can hold selects nothing forward, everything backward.
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, ValueError, OSError):
        return datetime.max.replace(tzinfo=UTC)


def entry_wire(entry: SandboxLogEntry) -> dict[str, object]:
    """E2B's ``SandboxLogEntry``."""
    return {
        "timestamp": _iso(entry.timestamp),
        "level": entry.level,
        "message": entry.message,
        "fields": {"logger": entry.logger, **entry.fields},
    }


def line_wire(entry: SandboxLogEntry) -> dict[str, str]:
    """E2B's v1 ``SandboxLog``: the entry as one JSON line (``level``, ``logger``,
    ``message`` and its fields), which E2B's CLI parses and prints."""
    record = {"level": entry.level, "logger": entry.logger, "message": entry.message}
    record.update({k: v for k, v in entry.fields.items() if k not in record})
    return {"timestamp": _iso(entry.timestamp), "line": json.dumps(record)}


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
