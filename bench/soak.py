"""Soak: mixed traffic against a real server for a while, then prove nothing drifted.

    .venv/bin/python bench/soak.py [--seconds 600] [--clients 4] [--sqlite] [--json]

Starts its own gunicorn (4 sync workers) and lifecycle worker on a fresh database (the
PostgreSQL server of DATABASE_URL, or SQLite with --sqlite) and SANDBOX_ROOT; needs root.
``--clients`` threads then send requests back to back (no think time: the highest rate the
machine sustains) for ``--seconds``: creates without a key and with a fresh key, replays of
earlier keyed creates, pauses, connects, kills, lists and gets, on a shared pool of
sandboxes kept between ``POOL_MIN`` and ``POOL_MAX``, so clients race each other on the
same sandboxes as real callers do.

Every answer is classified. Expected: the success statuses of each route, plus the answers
the retry table documents for races between clients (see ``EXPECTED``): 409 for a pause
that meets a paused or pausing sandbox, 404 for any operation on a sandbox another client
just killed, ... Anything else is unexpected: another status, a 5xx, a dropped connection,
an error not in E2B's shape, a replay whose body differs from the original's.

At the end (traffic stopped, one ``run_worker --once``) the database and the runtime must
agree exactly: no sandbox in the runtime that the database does not list as live (orphan),
none live in the database that the runtime lacks (ghost), same running/paused state, no
row left in a transitional state. Prints throughput, p50/p99 per route, statuses; exits 1
on any unexpected answer or disagreement. ``--json`` adds one JSON summary line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e2bfacade.settings")

import httpx  # noqa: E402

from tests.support import live_checks as lc  # noqa: E402
from tests.support.live_server import LiveServer, live_server  # noqa: E402

MAX_SECONDS = 3600
SANDBOX_ID = re.compile(r"\bi[a-z0-9]{20}\b")
POOL_MIN, POOL_MAX = 8, 40
# Routes (as reported) and the statuses that are a correct answer for them under races.
CREATE, CREATE_KEY, REPLAY = (
    "POST /v2/sandboxes",
    "POST /v2/sandboxes +key",
    "POST /v2/sandboxes replay",
)
PAUSE, CONNECT, KILL = (
    "POST /sandboxes/{id}/pause",
    "POST /v2/sandboxes/{id}/connect",
    "DELETE /sandboxes/{id}",
)
LIST, GET = "GET /v2/sandboxes", "GET /sandboxes/{id}"
EXPECTED: dict[str, set[int]] = {
    CREATE: {201},
    CREATE_KEY: {201},
    REPLAY: {201},  # and byte-identical to the original, with Idempotent-Replayed: true
    # 409: already paused / being paused / being killed / another transition outlasted the
    # wait; 404: another client killed it.
    PAUSE: {204, 409, 404},
    # 200 running, 201 resumed; 409 being killed or a transition outlasted the wait; 404.
    CONNECT: {200, 201, 409, 404},
    KILL: {204, 404},  # 404: another client killed it first
    LIST: {200},
    GET: {200, 404},
}
# How often each operation is picked (creates and kills balance; the pool bounds both).
MIX = [
    (CREATE, 8),
    (CREATE_KEY, 8),
    (REPLAY, 8),
    (PAUSE, 14),
    (CONNECT, 14),
    (KILL, 16),
    (LIST, 12),
    (GET, 20),
]


@dataclass
class Shared:
    """What the clients share: the pool of sandboxes, past keyed creates, the results."""

    tag: str
    timeout: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    pool: list[str] = field(default_factory=list)
    keyed: list[tuple[str, bytes]] = field(default_factory=list)  # (key, original body)
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    unexpected: list[str] = field(default_factory=list)
    unexpected_at: list[float] = field(default_factory=list)  # monotonic times
    reasons: Counter[str] = field(default_factory=Counter)  # expected 4xx, by message

    def body(self) -> dict[str, Any]:
        return {"templateID": "base", "timeout": self.timeout, "metadata": {"soak": self.tag}}


def pick(shared: Shared, rng: random.Random) -> str:
    with shared.lock:
        size = len(shared.pool)
    if size < POOL_MIN:
        return rng.choice([CREATE, CREATE_KEY])
    if size >= POOL_MAX:
        return KILL
    names, weights = zip(*MIX, strict=True)
    return str(rng.choices(names, weights)[0])


def one_request(http: httpx.Client, shared: Shared, op: str, rng: random.Random) -> None:
    sandbox_id = None
    key = original = None
    if op in (PAUSE, CONNECT, KILL, GET):
        with shared.lock:
            if not shared.pool:
                return
            sandbox_id = rng.choice(shared.pool)
    if op == REPLAY:
        with shared.lock:
            if not shared.keyed:
                return
            key, original = rng.choice(shared.keyed[-200:])
    if op == CREATE_KEY:
        key = str(uuid.uuid4())
    idempotency = {"Idempotency-Key": key} if key else {}
    requests: dict[str, Callable[[], httpx.Response]] = {
        CREATE: lambda: http.post("/v2/sandboxes", json=shared.body()),
        CREATE_KEY: lambda: http.post("/v2/sandboxes", json=shared.body(), headers=idempotency),
        REPLAY: lambda: http.post("/v2/sandboxes", json=shared.body(), headers=idempotency),
        PAUSE: lambda: http.post(f"/sandboxes/{sandbox_id}/pause"),
        CONNECT: lambda: http.post(f"/v2/sandboxes/{sandbox_id}/connect", json={}),
        KILL: lambda: http.delete(f"/sandboxes/{sandbox_id}"),
        LIST: lambda: http.get("/v2/sandboxes", params={"metadata": f"soak={shared.tag}"}),
        GET: lambda: http.get(f"/sandboxes/{sandbox_id}"),
    }
    send = requests[op]
    started = time.perf_counter()
    try:
        response = send()
    except httpx.HTTPError as exc:
        with shared.lock:
            shared.statuses[op][type(exc).__name__] += 1
            shared.unexpected.append(f"{op}: {type(exc).__name__}: {exc}")
            shared.unexpected_at.append(time.monotonic())
        return
    elapsed = time.perf_counter() - started
    status = response.status_code
    problem = None
    if status not in EXPECTED[op]:
        problem = f"{op}: unexpected {status} {response.text[:200]}"
    elif status >= 400:
        shape = lc.error_shape_problem(response)
        if shape:
            problem = f"{op}: {shape}"
        else:
            reason = SANDBOX_ID.sub("{id}", response.json()["message"])
            with shared.lock:
                shared.reasons[f"{op} {status}: {reason}"] += 1
    elif op == REPLAY and (
        response.content != original or response.headers.get("Idempotent-Replayed") != "true"
    ):
        problem = f"{op}: replay of {key} differs from the original: {response.text[:200]}"
    with shared.lock:
        shared.latencies[op].append(elapsed)
        shared.statuses[op][str(status)] += 1
        if problem:
            shared.unexpected.append(problem)
            shared.unexpected_at.append(time.monotonic())
        if op in (CREATE, CREATE_KEY) and status == 201:
            shared.pool.append(response.json()["sandboxID"])
            if op == CREATE_KEY:
                shared.keyed.append((key, response.content))  # type: ignore[arg-type]
        if op == KILL and sandbox_id in shared.pool:
            shared.pool.remove(sandbox_id)


def client_loop(server: LiveServer, shared: Shared, deadline: float, seed: int) -> None:
    rng = random.Random(seed)
    with lc.client(server, timeout=60) as http:
        while time.monotonic() < deadline:
            one_request(http, shared, pick(shared, rng), rng)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def report(shared: Shared, seconds: float) -> dict[str, Any]:
    rows = []
    total = 0
    for op, _ in MIX:
        lat = shared.latencies.get(op, [])
        count = sum(shared.statuses[op].values())
        total += count
        rows.append(
            {
                "route": op,
                "count": count,
                "per_second": round(count / seconds, 1),
                "p50_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
                "p99_ms": round(pct(lat, 99) * 1000, 1) if lat else None,
                "statuses": dict(sorted(shared.statuses[op].items())),
            }
        )
    return {"routes": rows, "requests": total, "per_second": round(total / seconds, 1)}


def server_exceptions(log_path: Path) -> dict[str, int]:
    """The last line of every traceback in the server's log (what the 5xx were), counted."""
    seen: Counter[str] = Counter()
    in_traceback = False
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and line and not line.startswith((" ", "\t")):
            seen[SANDBOX_ID.sub("{id}", line)[:240]] += 1
            in_traceback = False
    return dict(seen.most_common(10))


def agreement(server: LiveServer, shared: Shared) -> dict[str, Any]:
    """After one worker tick: database vs runtime, for every team; and the API's view."""
    server.run_worker_once()
    problems = lc.disagreements(server)
    with lc.client(server) as http:
        listed = lc.api_live(http)
    runtime = lc.runtime_states(server)
    if listed != runtime:
        problems.append(
            f"the API lists {len(listed)} live sandboxes, the runtime has {len(runtime)}"
        )
    states = Counter(runtime.values())
    return {"problems": problems, "live": len(runtime), "states": dict(states)}


def run(*, seconds: float, clients: int, database_url: str) -> dict[str, Any]:
    extra_env = {"API_RATE_LIMIT": "0", "LOG_LEVEL": "WARNING"}
    with live_server(database_url, extra_env=extra_env) as server:
        shared = Shared(tag=uuid.uuid4().hex[:12], timeout=int(seconds) + 600)
        # Warm-up: compiles sandboxd and builds the base image before the clock starts.
        with lc.client(server) as http:
            warm = http.post("/v2/sandboxes", json=shared.body())
            assert warm.status_code == 201, warm.text
            shared.pool.append(warm.json()["sandboxID"])
        started = time.monotonic()
        deadline = started + seconds
        threads = [
            threading.Thread(target=client_loop, args=(server, shared, deadline, i), daemon=True)
            for i in range(clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=seconds + 120)
        elapsed = time.monotonic() - started
        result = report(shared, elapsed)
        result["seconds"] = round(elapsed, 1)
        result["clients"] = clients
        result["database"] = "PostgreSQL" if lc.is_postgres(server) else "SQLite"
        result["server_5xx"] = len(lc.access_log_5xx(server.log_path))
        result["unexpected"] = len(shared.unexpected)
        result["unexpected_samples"] = shared.unexpected[:20]
        # When they happened, in seconds from the start: a burst or spread out?
        result["unexpected_between_s"] = (
            [
                round(shared.unexpected_at[0] - started, 1),
                round(shared.unexpected_at[-1] - started, 1),
            ]
            if shared.unexpected_at
            else None
        )
        result["server_exceptions"] = server_exceptions(server.log_path)
        result["keys"] = len(shared.keyed)
        result["expected_errors"] = dict(shared.reasons.most_common())
        result["agreement"] = agreement(server, shared)
    return result


def print_report(result: dict[str, Any]) -> None:
    print(
        f"soak: {result['seconds']} s, {result['clients']} clients, {result['database']}, "
        "4 gunicorn workers + lifecycle worker"
    )
    print(f"{'route':34} {'count':>7} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8}  statuses")
    for row in result["routes"]:
        statuses = " ".join(f"{s}x{n}" for s, n in row["statuses"].items())
        p50 = "-" if row["p50_ms"] is None else f"{row['p50_ms']:.1f}"
        p99 = "-" if row["p99_ms"] is None else f"{row['p99_ms']:.1f}"
        print(
            f"{row['route']:34} {row['count']:>7} {row['per_second']:>7} {p50:>8} {p99:>8}  "
            f"{statuses}"
        )
    print(f"{'total':34} {result['requests']:>7} {result['per_second']:>7}")
    print("expected error answers (races between clients), by message:")
    for reason, count in result["expected_errors"].items():
        print(f"  {count:>6}  {reason}")
    print(f"keyed creates: {result['keys']} keys, each replayed byte-identical or reported")
    print(
        f"unexpected answers: {result['unexpected']}; 5xx in the server's access log: "
        f"{result['server_5xx']}"
    )
    if result["unexpected_between_s"]:
        first, last = result["unexpected_between_s"]
        print(f"  all between {first} s and {last} s after the start; the first ones:")
    for sample in result["unexpected_samples"]:
        print(f"  {sample}")
    if result["server_exceptions"]:
        print("exceptions in the server's log (last line of each traceback):")
        for line, count in result["server_exceptions"].items():
            print(f"  {count:>6}  {line}")
    agreed = result["agreement"]
    if agreed["problems"]:
        print(f"database vs runtime after run_worker --once: {len(agreed['problems'])} problems")
        for problem in agreed["problems"][:20]:
            print(f"  {problem}")
    else:
        print(
            "database vs runtime after run_worker --once: agree exactly "
            f"({agreed['live']} live sandboxes: {agreed['states']}; no orphan, no ghost, "
            "none transitional)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="traffic time (default 600)")
    parser.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    parser.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    parser.add_argument("--json", action="store_true", help="also print a JSON summary line")
    args = parser.parse_args()
    if not 0 < args.seconds <= MAX_SECONDS:
        parser.error(f"--seconds must be in (0, {MAX_SECONDS}]")
    if not 1 <= args.clients <= 64:
        parser.error("--clients must be in [1, 64]")
    with contextlib.ExitStack() as stack:
        if args.sqlite:
            where = stack.enter_context(tempfile.TemporaryDirectory(prefix="e2bsoak-"))
            db = f"sqlite:///{where}/soak.sqlite3"
        else:
            db = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/e2bfacade")
            if not db.startswith(("postgres://", "postgresql://", "pgsql://")):
                parser.error("DATABASE_URL is not PostgreSQL; pass --sqlite for SQLite")
        result = run(seconds=args.seconds, clients=args.clients, database_url=db)
    print_report(result)
    if args.json:
        print("SOAK-JSON " + json.dumps(result))
    failed = result["unexpected"] or result["server_5xx"] or result["agreement"]["problems"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
