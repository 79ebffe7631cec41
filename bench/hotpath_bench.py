"""What an authenticated request costs before its view runs: the API-key lookup and the
rate-limit counter, side by side in one run, against a real server on PostgreSQL.

    .venv/bin/python bench/hotpath_bench.py [--n 300] [--rounds 4]

Starts one deployment (a fresh database on DATABASE_URL's PostgreSQL server, a fresh
SANDBOX_ROOT; needs root) with two servers on it: one trusting resolved API keys for 5 s
(``API_KEY_CACHE_SECONDS``, the default), one asking the database on every request (``0``).
In each round the rate-limit table is switched between PostgreSQL's ``UNLOGGED`` (the
migration's choice) and a logged table, and every combination is measured, one request of
each in turn, so the machine's drift falls on all alike. Two requests: ``GET
/v2/sandboxes?limit=1`` (a team with one sandbox) and the replay of a stored keyed create.
The hot path's target for the replay: p50 <= 3 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from bench.stats import percentile  # noqa: E402
from tests.support.live_server import Deployment  # noqa: E402

REQUESTS = ("GET /v2/sandboxes?limit=1", "replay of a keyed create")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300, help="requests of each kind per round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    suite = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/e2bfacade")
    with Deployment(postgres=True, teams=1, suite_url=suite) as dep:
        servers = {
            "key cached (5 s)": dep.server(workers=4, API_KEY_CACHE_SECONDS="5"),
            "key asked every time": dep.server(workers=4, API_KEY_CACHE_SECONDS="0"),
        }
        team = dep.take_team()
        clients = {
            name: httpx.Client(base_url=s.url, headers={"X-API-Key": team.api_key}, timeout=30)
            for name, s in servers.items()
        }
        body = {"templateID": "base", "timeout": 600}
        key = {"Idempotency-Key": f"bench-{uuid.uuid4().hex}"}
        first = next(iter(clients.values())).post("/sandboxes", json=body, headers=key)
        assert first.status_code == 201, first.text
        results: dict[tuple[str, str, str], list[float]] = {}
        for _ in range(args.rounds):
            for table in ("UNLOGGED", "LOGGED"):
                with dep.db() as conn:
                    conn.execute(f"ALTER TABLE e2bfacade_ratelimitwindow SET {table}")
                for _ in range(args.n):
                    for name, client in clients.items():
                        for what in REQUESTS:
                            t = time.perf_counter()
                            answer = (
                                client.get("/v2/sandboxes?limit=1")
                                if what == REQUESTS[0]
                                else client.post("/sandboxes", json=body, headers=key)
                            )
                            took = (time.perf_counter() - t) * 1000
                            assert answer.status_code in (200, 201), answer.text
                            results.setdefault((what, name, table), []).append(took)
        with dep.db() as conn:
            conn.execute("ALTER TABLE e2bfacade_ratelimitwindow SET UNLOGGED")
        next(iter(clients.values())).delete(f"/sandboxes/{first.json()['sandboxID']}")
        print(f"{'request':<28}{'API key':<22}{'rate-limit table':<18}{'p50 ms':>8}{'p99 ms':>8}")
        for (what, name, table), ms in results.items():
            p50, p99 = statistics.median(ms), percentile(ms, 99)
            print(f"{what:<28}{name:<22}{table:<18}{p50:>8.2f}{p99:>8.2f}")


if __name__ == "__main__":
    main()
