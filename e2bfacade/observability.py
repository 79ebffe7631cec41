"""What an operator watches: Prometheus metrics and one structured JSON log line per request.

Metrics (served at ``/metrics`` by :func:`e2bfacade.views.metrics`):

- ``e2bfacade_http_requests_total{method,route,status}`` and
  ``e2bfacade_http_request_duration_seconds{method,route}``: ``route`` is the URL *pattern*
  (``/sandboxes/<str:sandbox_id>/pause``), never the raw path, so a scan of random paths
  cannot blow up the number of series;
- ``e2bfacade_sandboxes_by_state{state}``: read from the database at scrape time, with one
  GROUP BY (the database is the source of truth, and every replica reports the same);
  defined by the sandboxes app (``sandboxes/observability.py``) and added to each scrape
  through :func:`register_scrape_collector`;
- ``e2bfacade_runtime_operation_seconds{op,outcome}``: every public runtime call;
- ``e2bfacade_idempotency_events_total{event}`` (executed, replay, mismatch, in_progress,
  takeover, release, unknown_outcome) and ``e2bfacade_idempotency_purged_records_total``.

Several gunicorn workers are aggregated through prometheus_client's multiprocess mode: each
process writes its counters to memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR`` and a
scrape sums them. ``gunicorn.conf.py`` (and ``scripts/serve.sh``) set that directory up and
empty it on start. Without the variable (``runserver``, the test suite, a one-off command)
each process keeps its own registry, and ``/metrics`` shows only the process that answers.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.registry import Collector

from e2bfacade.capabilities import CapabilityCollector

request_logger = logging.getLogger("e2bfacade.request")

# No ``*_created`` series: they double the output and nothing here graphs them (multiprocess
# mode never has them, so this also makes both modes read the same).
disable_created_metrics()  # type: ignore[no-untyped-call]

if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    # Metrics write their files there from the moment they are defined (below).
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)

# Runtime calls take milliseconds (freeze ~1 ms, create ~20 ms); requests a little more.
# Coarse at the top: a slow snapshot or a request that waited out another's key.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

HTTP_REQUESTS = Counter(
    "e2bfacade_http_requests",
    "HTTP requests answered, by route pattern and status.",
    ["method", "route", "status"],
)
HTTP_DURATION = Histogram(
    "e2bfacade_http_request_duration_seconds",
    "Time to answer an HTTP request, by route pattern.",
    ["method", "route"],
    buckets=BUCKETS,
)
RUNTIME_DURATION = Histogram(
    "e2bfacade_runtime_operation_seconds",
    "Duration of sandbox runtime operations; outcome is ok or error.",
    ["op", "outcome"],
    buckets=BUCKETS,
)
IDEMPOTENCY_EVENTS = Counter(
    "e2bfacade_idempotency_events",
    "Idempotency-Key decisions: executed (a new key ran), replay, mismatch, in_progress "
    "(answered 409), takeover (a dead owner's claim re-driven), release (nothing was "
    "allocated: the key may try again), unknown_outcome (422).",
    ["event"],
)
IDEMPOTENCY_PURGED = Counter(
    "e2bfacade_idempotency_purged_records",
    "Expired idempotency records deleted.",
)
IDEMPOTENCY_EVENT_NAMES = (
    "executed",
    "replay",
    "mismatch",
    "in_progress",
    "takeover",
    "release",
    "unknown_outcome",
)

# The idempotency outcome of the request being served (read by the request log line).
_idempotency_outcome: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "idempotency_outcome", default=None
)


def idempotency_event(event: str) -> None:
    """Count an idempotency decision and remember it as this request's outcome (the last
    one wins: a takeover that then releases the key is logged as ``release``)."""
    IDEMPOTENCY_EVENTS.labels(event).inc()
    _idempotency_outcome.set(event)


def idempotency_purged(count: int) -> None:
    IDEMPOTENCY_PURGED.inc(count)


SANDBOXES_LOST = Counter(
    "e2bfacade_sandboxes_lost",
    "Sandboxes the database held live of which their host had nothing left (files gone): "
    "recorded killed with the reason. Anything above zero is data loss to look into.",
)


def sandbox_lost() -> None:
    SANDBOXES_LOST.inc()


VOLUME_ORPHANS_REMOVED = Counter(
    "e2bfacade_volume_orphans_removed",
    "Volume storage the worker removed from its host because no volume row named it (a "
    "team's delete cascades to its volume rows and leaves their storage).",
)


def volume_orphan_removed() -> None:
    VOLUME_ORPHANS_REMOVED.inc()


# ------------------------------------------------------------------------------ runtime
# The operations of e2bfacade.runtime.base.Runtime, and of the guests it resolves
# (e2bfacade.runtime.guest.Guest): only these are timed (helpers and attributes pass
# through), which also bounds the ``op`` label.
RUNTIME_OPERATIONS = (
    "import_image",
    "image_info",
    "delete_image",
    "list_images",
    "create",
    "status",
    "list",
    "pause",
    "resume",
    "snapshot",
    "kill",
    "metrics",
    "sweep",
    "census",
    "guest",
)
GUEST_OPERATIONS = (
    "start_process",
    "stat",
    "list_dir",
    "make_dir",
    "move",
    "remove",
    "read_file",
    "write_file",
)
_timing = threading.local()
R = TypeVar("R")


def _timed(op: str, method: Callable[..., R]) -> Callable[..., R]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> R:
        # Only the outermost operation is timed: pause() calls status() internally, and
        # that inner call is part of the pause, not a status request of its own.
        if getattr(_timing, "active", False):
            return method(self, *args, **kwargs)
        _timing.active = True
        outcome = "error"
        started = time.perf_counter()
        try:
            result = method(self, *args, **kwargs)
            outcome = "ok"
            return result
        finally:
            _timing.active = False
            RUNTIME_DURATION.labels(op, outcome).observe(time.perf_counter() - started)

    return call


T = TypeVar("T")


@functools.cache
def metered(cls: type[T]) -> type[T]:
    """A subclass of the runtime class ``cls`` whose operations record their duration.

    A subclass rather than a proxy object, so that ``isinstance(get_runtime(), <the driver>)``
    still holds and the runtime's attributes (``root``, ``cgroups``) need no forwarding."""
    timed: dict[str, Any] = {
        op: _timed(op, getattr(cls, op)) for op in RUNTIME_OPERATIONS if hasattr(cls, op)
    }
    if "guest" in timed:
        resolve = timed["guest"]

        def guest(self: Any, sandbox_id: str) -> _MeteredGuest:
            return _MeteredGuest(resolve(self, sandbox_id))

        timed["guest"] = guest
    return cast(type[T], type(cls.__name__, (cls,), {**timed, "__module__": cls.__module__}))


_guest_timed: dict[type, dict[str, Callable[..., Any]]] = {}  # per Guest class


def _guest_operations(cls: type) -> dict[str, Callable[..., Any]]:
    timed = _guest_timed.get(cls)
    if timed is None:
        timed = {op: _timed(op, getattr(cls, op)) for op in GUEST_OPERATIONS if hasattr(cls, op)}
        _guest_timed[cls] = timed
    return timed


class _MeteredGuest:
    """A resolved guest whose operations record their duration, under the names the
    runtime's own had (``op="start_process"``); everything else passes through."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._timed = _guest_operations(type(inner))

    def __getattr__(self, name: str) -> Any:
        op = self._timed.get(name)
        if op is None:
            return getattr(self._inner, name)
        return functools.partial(op, self._inner)


# ----------------------------------------------------------------------------- scraping
# Collectors computed at scrape time (database gauges), contributed by the apps that own the
# data: e2bfacade sits below every app and imports none of them, so an app registers its
# gauge here from its AppConfig.ready() (sandboxes: ``e2bfacade_sandboxes_by_state``).
_scrape_collectors: list[Collector] = []


def register_scrape_collector(collector: Collector) -> None:
    """Add ``collector`` to every scrape. Registering the same object again is a no-op, so
    an app's ready() may run more than once."""
    if collector not in _scrape_collectors:
        _scrape_collectors.append(collector)


class _ThisProcess(Collector):
    """The default registry of this process (per-process mode, no multiproc directory)."""

    def collect(self) -> Iterator[Any]:
        yield from REGISTRY.collect()


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def scrape() -> bytes:
    """The exposition text for one scrape."""
    registry = CollectorRegistry()
    if multiprocess_dir():
        # Sums the files of every process that wrote to the directory, dead ones included
        # (a recycled gunicorn worker's counts must not vanish from a counter).
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_ThisProcess())
    for collector in _scrape_collectors:
        registry.register(collector)
    registry.register(CapabilityCollector())
    return generate_latest(registry)


# --------------------------------------------------------------------------------- logs
class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the record's ``json_fields``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(getattr(record, "json_fields", {}))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


# A caller's X-Request-Id is reused when it looks like an id (a proxy's or a client's), so a
# request can be followed across hops; anything else is replaced, never echoed.
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:+/=-]{1,128}")
REQUEST_ID_HEADER = "X-Request-Id"


def _route(request: HttpRequest) -> str:
    match = request.resolver_match  # set once the URL resolved; None before and for a 404
    if match is not None:
        return "/" + str(match.route)
    if request.path.startswith("/" + settings.STATIC_URL.lstrip("/")):
        return "(static)"  # answered by whitenoise before URL resolution
    return "(unmatched)"


def _team_id(request: HttpRequest) -> int | None:
    # DRF copies the authenticated ApiKey onto the Django request as ``auth``.
    return getattr(getattr(request, "auth", None), "team_id", None)


class RequestObservabilityMiddleware:
    """Outermost middleware: request id, request metrics and the JSON request log line.

    The log line holds what an operator needs to follow a request and nothing a client
    would not want written down: no body (stored or not), no API key, and of the
    Idempotency-Key only whether one was sent."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        incoming = request.headers.get(REQUEST_ID_HEADER, "")
        request_id = incoming if REQUEST_ID_PATTERN.fullmatch(incoming) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        token = _idempotency_outcome.set(None)
        started = time.perf_counter()
        status = 500  # if a layer below raised instead of answering
        try:
            response = self.get_response(request)
            status = response.status_code
            response[REQUEST_ID_HEADER] = request_id
            return response
        finally:
            duration = time.perf_counter() - started
            route = _route(request)
            method = request.method or ""
            HTTP_REQUESTS.labels(method, route, str(status)).inc()
            HTTP_DURATION.labels(method, route).observe(duration)
            request_logger.info(
                "request",
                extra={
                    "json_fields": {
                        "request_id": request_id,
                        "method": method,
                        "route": route,
                        "path": request.path[:512],
                        "status": status,
                        "duration_ms": round(duration * 1000, 2),
                        "team_id": _team_id(request),
                        "idempotency_key": "Idempotency-Key" in request.headers,
                        "idempotency": _idempotency_outcome.get(),
                    }
                },
            )
            _idempotency_outcome.reset(token)
