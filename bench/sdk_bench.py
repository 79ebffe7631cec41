"""Sandbox lifecycle through the real E2B Python SDK, against a real server.

    .venv/bin/python bench/sdk_bench.py [--n 100] [--sqlite]

Starts its own gunicorn (4 sync workers) and lifecycle worker on a fresh database (the
PostgreSQL server of DATABASE_URL, or SQLite with --sqlite) and SANDBOX_ROOT; needs root.
Prints median and p99 of: Sandbox.create (create -> running, as the SDK returns it),
pause, connect (which resumes a paused sandbox), and kill. Target: create p50 <= 40 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2b import Sandbox  # noqa: E402

from bench.stats import database_url  # noqa: E402
from tests.support.live_server import live_server  # noqa: E402


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="iterations (default 100)")
    parser.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    args = parser.parse_args()
    db = database_url(args.sqlite)
    with live_server(db) as server:
        os.environ["E2B_API_URL"] = server.url
        os.environ["E2B_API_KEY"] = server.api_key
        os.environ.pop("E2B_DEBUG", None)
        Sandbox.create(timeout=60).kill()  # warm-up: compiles sandboxd, builds the base image
        times: dict[str, list[float]] = {
            "create": [],
            "pause": [],
            "connect (resume)": [],
            "kill": [],
        }
        for _ in range(args.n):
            t = time.perf_counter()
            sandbox = Sandbox.create(timeout=120)
            times["create"].append(time.perf_counter() - t)
            t = time.perf_counter()
            assert sandbox.pause()
            times["pause"].append(time.perf_counter() - t)
            t = time.perf_counter()
            Sandbox.connect(sandbox.sandbox_id, timeout=120)
            times["connect (resume)"].append(time.perf_counter() - t)
            t = time.perf_counter()
            assert sandbox.kill()
            times["kill"].append(time.perf_counter() - t)
    backend = "SQLite" if args.sqlite else "PostgreSQL"
    print(f"E2B Python SDK against e2bfacade (4 gunicorn workers, {backend}), {args.n} iterations")
    print(f"{'operation':<18} {'p50 ms':>8} {'p99 ms':>8}")
    for name, values in times.items():
        p50 = statistics.median(values) * 1000
        print(f"{name:<18} {p50:8.2f} {pct(values, 99) * 1000:8.2f}")
    p50 = statistics.median(times["create"]) * 1000
    print(f"SUMMARY create p50 {p50:.1f} ms (target <= 40 ms: {'met' if p50 <= 40 else 'MISSED'})")


if __name__ == "__main__":
    main()
