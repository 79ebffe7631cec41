"""gunicorn settings, read automatically when gunicorn starts from the repository root
(``scripts/serve.sh``, the test suite's live servers). Flags on the command line win.

Workers: sync workers, one request at a time each. A request spends most of its time waiting
on PostgreSQL or on a runtime call of a few milliseconds (or, for a create that meets
another request with the same Idempotency-Key, up to IDEMPOTENCY_WAIT_SECONDS): more
workers than cores pays, but the usual ``2 x cores + 1`` overshoots the database's
connections on several replicas. See docs/operations.md, "How many workers".
"""

import glob
import os
import shutil
import tempfile

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:3000")
workers = int(os.environ.get("WEB_CONCURRENCY", "4"))
# The application is imported once, by the master, and the workers fork from it: a worker
# (re)start costs a fork, not the 1.2 s of CPU importing Django and the apps takes each time
# (measured at a start of 4 workers: 9.6 s of CPU in all without, see docs/performance.md),
# and the workers share the imported code's memory. Nothing at import opens a connection or
# starts a thread (the database and the runtime are reached on the first request).
preload_app = True
# Sandbox operations are short (milliseconds) but a create may wait briefly for another
# request with the same Idempotency-Key: keep the timeout well above IDEMPOTENCY_WAIT_SECONDS.
timeout = 60
graceful_timeout = 30
# No request-line limit: gunicorn's own 414 page is HTML, and the E2B SDKs need every error
# in {code, message}. `manage.py serve` puts nginx in front (e2bfacade/front.py), which
# bounds the request line and headers and answers in that shape; a gunicorn on its own
# (`serve --no-front`) belongs behind a proxy with limits of its own.
limit_request_line = 0
# Let workers finish in-flight requests on SIGTERM; recycle them now and then to bound leaks.
max_requests = 10000
max_requests_jitter = 1000
# No access log by default: every request already gets one JSON line (request id, route,
# status, duration, team, idempotency outcome) from e2bfacade.observability on stderr.
# `--access-logfile -` brings gunicorn's back.

# --- Prometheus multiprocess mode ------------------------------------------------------
# Each worker writes its metrics to files in PROMETHEUS_MULTIPROC_DIR and /metrics sums
# them, whichever worker answers. The variable must be set before a worker imports
# prometheus_client, hence here, in the master, which the workers inherit it from. Unset:
# a private directory for this gunicorn, removed when it exits.
_PREFIX = "e2bfacade-metrics-"
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    # A gunicorn killed with SIGKILL never runs on_exit: remove such leftovers (their
    # master pid is in the name and no longer alive) so that /tmp does not fill up.
    for _stale in glob.glob(os.path.join(tempfile.gettempdir(), _PREFIX + "*-*")):
        _pid = os.path.basename(_stale)[len(_PREFIX) :].split("-", 1)[0]
        if _pid.isdigit() and not os.path.exists(f"/proc/{_pid}"):
            shutil.rmtree(_stale, ignore_errors=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
    # Whose directory it is goes in the environment, not a module variable: a reload
    # (SIGHUP) re-reads this file, and by then the variable above is set.
    os.environ["E2BFACADE_OWN_METRICS_DIR"] = "1"


def on_starting(server):  # type: ignore[no-untyped-def]
    # Files left by an earlier run would be summed into this run's counters: start empty.
    path = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        if name.endswith(".db"):
            os.unlink(os.path.join(path, name))
    server.log.info("Prometheus multiprocess directory: %s", path)


def child_exit(server, worker):  # type: ignore[no-untyped-def]
    # A dead worker's live gauges must stop counting; its counters and histograms stay
    # (a counter must never go down when a worker is recycled).
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def on_exit(server):  # type: ignore[no-untyped-def]
    if os.environ.get("E2BFACADE_OWN_METRICS_DIR"):
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


def post_worker_init(worker):  # type: ignore[no-untyped-def]
    # A master that dies (SIGKILL, the OOM killer) takes its workers with it. A sync worker
    # notices a new parent only between waits of up to half the timeout (30 s), meanwhile
    # answering on the port and holding it against the next start. Here, with the worker's
    # own handlers in place, SIGTERM makes it finish its request and exit; a master already
    # gone before the request was made ends it the same way.
    from e2bfacade.supervision import die_with_parent

    if not die_with_parent(worker.ppid):
        worker.alive = False
