"""What one reconcile tick of the lifecycle worker costs at a number of live sandboxes.

    .venv/bin/python bench/reconcile_bench.py [--sandboxes 1000] [--ticks 20] [--sqlite]

Starts a deployment (a fresh database on DATABASE_URL's PostgreSQL server, or SQLite, and
a fresh SANDBOX_ROOT; needs root), starts ``--sandboxes`` real sandboxes in its runtime
(16 MB of memory and disk each, so that the host holds them) with a database row each,
as the API would have written them, and times ``sandbox_reconcile()`` -- the worker's tick:
the database's live rows, the runtime's ``live_ids`` and its sweep -- ``--ticks`` times,
with those two also timed alone, and the runtime's full ``list`` (what the API's calls
use) beside them. Everything is removed at the end. ``RECONCILE_PROFILE=1`` also prints a
cProfile of one tick.
The hot path's target: a tick <= 20 ms at 1 000 sandboxes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stats import figure, percentile  # noqa: E402
from tests.support.live_server import Deployment  # noqa: E402


def child(count: int, ticks: int) -> None:
    """Inside the deployment's environment: make the sandboxes, time the ticks."""
    import django

    django.setup()
    from datetime import timedelta

    from django.utils import timezone

    from e2bfacade.models import Team
    from e2bfacade.runtime.base import MIN_DISK_MB, SandboxSpec
    from e2bfacade.sandbox_runtime import get_runtime
    from sandboxes.models import Sandbox, new_sandbox_id
    from sandboxes.worker import raise_open_files_limit, sandbox_reconcile
    from templates.models import Template

    raise_open_files_limit()  # as run_worker does
    runtime = get_runtime()
    team = Team.objects.order_by("pk").first()
    template = Template.objects.get(pk="base")
    now = timezone.now()
    rows = []
    started = time.perf_counter()
    for _ in range(count):
        sandbox_id = new_sandbox_id()
        spec = SandboxSpec(sandbox_id, template.image_id, memory_mb=16, disk_mb=MIN_DISK_MB)
        runtime.create(spec)
        rows.append(
            Sandbox(
                sandbox_id=sandbox_id,
                team=team,
                template=template,
                alias="base",
                state=Sandbox.State.RUNNING,
                state_changed_at=now,
                started_at=now,
                end_at=now + timedelta(hours=1),
                cpu_count=1,
                memory_mb=16,
                disk_size_mb=MIN_DISK_MB,
                envd_version=template.envd_version,
            )
        )
    Sandbox.objects.bulk_create(rows, batch_size=1000)
    made_s = time.perf_counter() - started
    names = ("tick", "live_ids", "sweep", "list (API)")
    timings: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(ticks):
        t0 = time.perf_counter()
        outcome = sandbox_reconcile()
        t1 = time.perf_counter()
        assert not outcome["gone"] and not outcome["orphans"], outcome  # all agree
        live = runtime.live_ids()
        t2 = time.perf_counter()
        runtime.sweep(seen_live=live)
        t3 = time.perf_counter()
        runtime.list()
        t4 = time.perf_counter()
        timings["tick"].append((t1 - t0) * 1000)
        timings["live_ids"].append((t2 - t1) * 1000)
        timings["sweep"].append((t3 - t2) * 1000)
        timings["list (API)"].append((t4 - t3) * 1000)
    if os.environ.get("RECONCILE_PROFILE"):
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.runcall(sandbox_reconcile)
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    print("RESULT " + json.dumps({"made_s": made_s, "timings": timings}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.sandboxes <= 5000 or not 1 <= args.ticks <= 1000:
        parser.error("--sandboxes must be in [1, 5000] and --ticks in [1, 1000]")
    if args.child:
        child(args.sandboxes, args.ticks)
        return
    suite = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/e2bfacade")
    with Deployment(postgres=not args.sqlite, teams=1, prefix="e2bbench", suite_url=suite) as dep:
        env = {**dep.env, "SANDBOX_SPARES": "2"}
        proc = subprocess.run(
            [sys.executable, __file__, "--child", "--sandboxes", str(args.sandboxes),
             "--ticks", str(args.ticks)],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if os.environ.get("RECONCILE_PROFILE"):
            print(proc.stderr[-12000:])
        if proc.returncode != 0:
            sys.exit(f"the bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        result = json.loads(line.removeprefix("RESULT "))
    database = "SQLite" if args.sqlite else "PostgreSQL"
    print(
        f"reconcile, {args.sandboxes} live sandboxes, {database} "
        f"({result['made_s']:.1f} s to start them)"
    )
    for name, values in result["timings"].items():
        p50, p99 = percentile(values, 50), percentile(values, 99)
        print(f"  {name:<14} n={len(values):<4} p50 {p50:8.2f} ms  p99 {p99:8.2f} ms")
    verdict = "MET" if percentile(result["timings"]["tick"], 50) <= 20 else "MISSED"
    db = "sqlite" if args.sqlite else "pg"
    figure(f"{db}.reconcile.{args.sandboxes}.tick_p50", percentile(result["timings"]["tick"], 50))
    print(f"  hot-path target, a tick <= 20 ms at 1 000 sandboxes: {verdict}")


if __name__ == "__main__":
    main()
