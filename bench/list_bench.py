"""``GET /v2/sandboxes?limit=100`` as a team grows: 100, 1 000 and 10 000 live sandboxes,
with the live-list index (migration sandboxes 0004) and without it, side by side.

    .venv/bin/python bench/list_bench.py [--n 100]

Starts a deployment (a fresh database on DATABASE_URL's PostgreSQL server; needs root for
the server's runtime) and one server without the lifecycle worker: the sandboxes are rows
written straight into the database (a tenth of them killed, a seventh paused, the rest
running), which the worker would reconcile away, since no runtime holds them. At each size
the index is dropped and made again, and requests with and without it alternate; then the
v1 list (``GET /sandboxes``: every running sandbox, no paging) is timed. The hot path's
targets: the v2 page's p50 at 10 000 live sandboxes <= 1.5 x its value at 100; the v1 list
at 10 000 <= 50 ms.
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

import httpx  # noqa: E402

from bench.stats import figure, percentile  # noqa: E402
from tests.support.live_server import Deployment  # noqa: E402

INDEX = (
    "CREATE INDEX IF NOT EXISTS sandbox_live_list_idx ON sandboxes_sandbox "
    "(team_id, started_at DESC, sandbox_id DESC) "
    "WHERE state IN ('running', 'resuming', 'paused', 'pausing')"
)
DROP = "DROP INDEX IF EXISTS sandbox_live_list_idx"
RUNNING = "SELECT count(*) FROM sandboxes_sandbox WHERE team_id = %s AND state = 'running'"
COUNT = "SELECT count(*) FROM sandboxes_sandbox WHERE team_id = %s AND state <> 'killed'"
ROWS = """
INSERT INTO sandboxes_sandbox (sandbox_id, alias, state, state_changed_at, started_at, end_at,
    cpu_count, memory_mb, disk_size_mb, envd_version, envd_access_token, metadata, env_vars,
    on_timeout, auto_resume, allow_internet_access, team_id, template_id, network,
    traffic_access_token)
SELECT 'bench' || g, '',
    CASE WHEN g %% 10 = 0 THEN 'killed' WHEN g %% 7 = 0 THEN 'paused' ELSE 'running' END,
    now(), now() - (g || ' seconds')::interval, now() + interval '1 day', 2, 512, 1024,
    '0.6.4', 'token', jsonb_build_object('k', 'v' || (g %% 50)), '{}', 'kill', false, true,
    %s::bigint, 'base', '{}', ''
FROM generate_series(%s::int, %s::int) g
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100, help="requests of each kind per size")
    args = parser.parse_args()
    suite = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/e2bfacade")
    with Deployment(postgres=True, teams=1, suite_url=suite) as dep:
        server = dep.server(workers=4)
        team = dep.take_team()
        client = httpx.Client(base_url=server.url, headers={"X-API-Key": team.api_key})
        made = 0
        print(f"{'live sandboxes':<16}{'index':<10}{'p50 ms':>8}{'p99 ms':>8}")
        for live in (100, 1_000, 10_000):
            # Live rows are 9 in 10 of those written: write until `live` are live.
            total = -(-live * 10 // 9)
            with dep.db() as conn:
                conn.execute(ROWS, (team.team_id, made + 1, total))
                conn.execute("ANALYZE sandboxes_sandbox")
                (count,) = conn.execute(COUNT, (team.team_id,)).fetchone()
            made = total
            timings: dict[str, list[float]] = {"with": [], "without": []}
            for _ in range(args.n):
                for kind in ("with", "without"):
                    with dep.db() as conn:
                        conn.execute(
                            INDEX
                            if kind == "with"
                            else "DROP INDEX IF EXISTS sandbox_live_list_idx"
                        )
                    t = time.perf_counter()
                    answer = client.get("/v2/sandboxes", params={"limit": 100})
                    timings[kind].append((time.perf_counter() - t) * 1000)
                    assert answer.status_code == 200 and len(answer.json()) == 100, answer.text
            figure(f"pg.list.v2_{live}.p50", statistics.median(timings["with"]))
            for kind, ms in timings.items():
                print(
                    f"{count:<16}{kind:<10}{statistics.median(ms):>8.2f}{percentile(ms, 99):>8.2f}"
                )
            with dep.db() as conn:
                conn.execute(INDEX)
                (running,) = conn.execute(RUNNING, (team.team_id,)).fetchone()
            v1 = []
            for _ in range(max(5, args.n // 4)):
                t = time.perf_counter()
                answer = client.get("/sandboxes")
                v1.append((time.perf_counter() - t) * 1000)
                assert answer.status_code == 200 and len(answer.json()) == running
            print(f"{'':<16}{'v1 list (all ' + str(running) + ' running)':<34}", end="")
            print(f"{statistics.median(v1):>8.2f}{percentile(v1, 99):>8.2f}")
            figure(f"pg.list.v1_{live}.p50", statistics.median(v1))
        with dep.db() as conn:
            conn.execute(INDEX)


if __name__ == "__main__":
    main()
