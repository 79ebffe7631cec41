"""Purge throughput on a large table, and what a purge does to creates running beside it.

    .venv/bin/python bench/purge_bench.py                  # 1,000,000 expired records
    .venv/bin/python bench/purge_bench.py --records 200000 --batch-size 5000

PostgreSQL only (the records are made with one ``INSERT ... SELECT generate_series``).
Creates its own database and gunicorn (4 sync workers); needs root (the local runtime).

1. Inserts N expired, completed records holding a real Fernet ciphertext (made by the
   server's own configuration) as their stored request and response.
2. Times a keyed-create loop alone (before), then the same loop while
   ``manage.py purge_idempotency_keys`` runs (during), and reports p50/p99 of each.
3. Reports the purge's records/s. Target: at least 20,000/s.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from tests.support.live_server import Deployment  # noqa: E402

BODY = {"templateID": "base", "timeout": 300}
TOKEN = "from e2bfacade import crypto; print(crypto.encrypt(b'{\"placeholder\": true}').decode())"
INSERT = """
INSERT INTO idempotency_idempotencyrecord (
    team_id, key, route, fingerprint, state, lease_owner, lease_expires_at, attempt,
    resource_id, request_encrypted, response_status, response_content_type,
    response_body_encrypted, created_at, completed_at, expires_at)
SELECT %(team)s, 'expired-' || g, 'POST /v2/sandboxes', 'v1:' || md5(g::text) || md5(g::text),
       'completed', 'gone', now() - interval '2 days', 1, 'i' || lpad(g::text, 20, '0'),
       %(blob)s, 201, 'application/json', %(blob)s, now() - interval '2 days',
       now() - interval '2 days', now() - interval '1 day' + g * interval '1 millisecond'
FROM generate_series(1, %(n)s) AS g
"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(name: str, values: list[float]) -> str:
    return (
        f"{name:<30} n={len(values):<5} p50 {statistics.median(values) * 1000:8.2f} ms  "
        f"p99 {pct(values, 99) * 1000:8.2f} ms  max {max(values) * 1000:8.2f} ms"
    )


def create_loop(
    url: str, api_key: str, stop: threading.Event, out: list[float], min_n: int
) -> None:
    """Keyed creates one after another until ``stop`` (and at least ``min_n``); each
    sandbox is killed right after, untimed."""
    with httpx.Client(base_url=url, headers={"X-API-Key": api_key}, timeout=60) as http:
        while not stop.is_set() or len(out) < min_n:
            t = time.perf_counter()
            r = http.post(
                "/v2/sandboxes", json=BODY, headers={"Idempotency-Key": str(uuid.uuid4())}
            )
            out.append(time.perf_counter() - t)
            assert r.status_code == 201, r.text
            http.delete(f"/sandboxes/{r.json()['sandboxID']}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--before", type=int, default=100, help="creates timed before purging")
    args = parser.parse_args()
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/e2bfacade")
    deployment = Deployment(postgres=True, teams=2, prefix="e2bpurge")
    try:
        server = deployment.server(workers=4)
        team = deployment.take_team()
        blob = deployment.manage("shell", "-c", TOKEN).strip().splitlines()[-1].encode()

        t = time.perf_counter()
        with deployment.db() as conn:
            conn.execute(INSERT, {"team": team.team_id, "blob": blob, "n": args.records})
            conn.execute("ANALYZE idempotency_idempotencyrecord")
        inserted = deployment.query(
            "SELECT count(*) FROM idempotency_idempotencyrecord WHERE expires_at <= now()"
        )[0][0]
        print("e2bfacade purge bench: PostgreSQL, gunicorn 4 sync workers")
        print(
            f"inserted {inserted:,} expired records in {time.perf_counter() - t:.1f}s "
            f"(stored bodies: a {len(blob)}-byte Fernet token each)"
        )

        # Warm up, then creates alone.
        warm: list[float] = []
        done = threading.Event()
        done.set()
        create_loop(server.url, team.api_key, done, warm, 10)
        before: list[float] = []
        create_loop(server.url, team.api_key, done, before, args.before)

        # The same loop while the purge runs.
        during: list[float] = []
        stop = threading.Event()
        loop = threading.Thread(
            target=create_loop, args=(server.url, team.api_key, stop, during, 1)
        )
        loop.start()
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "purge_idempotency_keys",
                "--batch-size",
                str(args.batch_size),
            ],
            cwd=REPO,
            env=deployment.env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        wall = time.perf_counter() - started
        stop.set()
        loop.join()
        if proc.returncode != 0:
            print(proc.stdout, proc.stderr)
            return 1
        match = re.search(r"deleted (\d+) expired idempotency records in ([\d.]+)s", proc.stdout)
        assert match, proc.stdout
        deleted, seconds = int(match.group(1)), float(match.group(2))
        left = deployment.query(
            "SELECT count(*) FROM idempotency_idempotencyrecord WHERE key LIKE 'expired-%%'"
        )[0][0]
        live = deployment.query(
            "SELECT count(*) FROM idempotency_idempotencyrecord WHERE key NOT LIKE 'expired-%%'"
        )[0][0]

        rate = deleted / seconds
        print(
            f"\npurge (--batch-size {args.batch_size}): deleted {deleted:,} in {seconds:.2f}s "
            f"(process wall {wall:.2f}s incl. Django start) = {rate:,.0f} records/s "
            f"(target >= 20,000/s) {'PASS' if rate >= 20_000 else 'MISS'}"
        )
        print(
            f"expired records left: {left}; live records kept: {live} "
            f"(= creates made: {len(warm) + len(before) + len(during)})"
        )
        print("\nkeyed create latency (raw httpx, each sandbox killed after, untimed)")
        print("   ", summary("before the purge", before))
        print("   ", summary("during the purge", during))
        print(f"    p99 during / before: {pct(during, 99) / pct(before, 99):.2f}x")
        return 0
    finally:
        deployment.close()


if __name__ == "__main__":
    sys.exit(main())
