"""The volume content API (``/volumecontent/…`` on the data plane), against a real server.

    .venv/bin/python bench/volume_content_bench.py [--n 10] [--mib 100] [--sqlite]

Starts its own API, data plane (2 uvicorn workers) and lifecycle worker on a fresh database
(the PostgreSQL server of DATABASE_URL, or SQLite with --sqlite) and SANDBOX_ROOT; needs
root. Makes a volume with the real E2B Python SDK (``Volume.create``), then times ``--n``
uploads (PUT, ``force``) and downloads (GET) of ``--mib`` MiB each, through the SDK
(``write_file`` of a file object, ``read_file`` as bytes and as a stream) and through a raw
HTTP client (httpx, streamed both ways), and prints medians, p99s and MB/s (10^6 bytes a
second), with the data plane's memory growth over the whole run. Target (docs/dataplane.md,
"Volume content"): >= 200 MB/s each way.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2b import Volume  # noqa: E402

from bench.stats import database_url, figure, percentile  # noqa: E402
from tests.support.live_server import live_server  # noqa: E402

MiB = 1 << 20


def rss_of(pid: int) -> int:
    """Resident bytes of a process and its children (the data plane's workers)."""
    out = subprocess.run(
        ["ps", "-o", "rss=", "--ppid", str(pid), "-p", str(pid)], capture_output=True, text=True
    )
    return sum(int(x) for x in out.stdout.split()) * 1024


def timed(n: int, fn: Callable[[], None]) -> list[float]:
    fn()  # warm: connections, first allocations
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def report(name: str, seconds: list[float], size: int, key: str) -> None:
    median = statistics.median(seconds)
    p99 = percentile(seconds, 99)
    rate = size / median / 1e6
    print(f"{name:<40}{median * 1000:>10.1f}{p99 * 1000:>10.1f}{rate:>10.0f}   >= 200 MB/s")
    figure(f"volume_content.{key}_mb_s", rate)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--sqlite", action="store_true")
    args = parser.parse_args()
    size = args.mib * MiB
    payload = hashlib.sha256(b"bench").digest() * (size // 32)
    want = hashlib.sha256(payload).hexdigest()

    with live_server(
        database_url(args.sqlite), workers=2, extra_env={"VOLUME_MAX_MB": str(4 * args.mib)}
    ) as server:
        os.environ.update(
            E2B_API_URL=server.url,
            E2B_API_KEY=server.api_key,
            E2B_VOLUME_API_URL=server.sandbox_url,
        )
        for name in ("E2B_DEBUG", "E2B_DOMAIN"):
            os.environ.pop(name, None)
        vol = Volume.create(f"bench-{uuid.uuid4().hex[:8]}")
        assert server.dataplane is not None
        dataplane = server.dataplane.pid
        rss_before = rss_of(dataplane)
        base = f"/volumecontent/{vol.volume_id}/file"
        http = httpx.Client(
            base_url=server.sandbox_url,
            headers={"Authorization": f"Bearer {vol.token}"},
            timeout=300,
        )

        def sdk_put() -> None:
            entry = vol.write_file("/big.bin", io.BytesIO(payload), force=True)
            assert entry.size == size

        def sdk_get_bytes() -> None:
            assert len(vol.read_file("/big.bin", format="bytes")) == size

        def sdk_get_stream() -> None:
            got = sum(len(c) for c in vol.read_file("/big.bin", format="stream"))
            assert got == size

        def chunks() -> Iterator[bytes]:
            view = memoryview(payload)
            for at in range(0, size, MiB):
                yield bytes(view[at : at + MiB])

        def raw_put() -> None:
            r = http.put(base, params={"path": "/raw.bin", "force": "true"}, content=chunks())
            assert r.status_code == 201, r.text

        def raw_get() -> None:
            digest = hashlib.sha256()
            with http.stream("GET", base, params={"path": "/raw.bin"}) as r:
                assert r.status_code == 200
                for chunk in r.iter_bytes(MiB):
                    digest.update(chunk)
            assert digest.hexdigest() == want

        print(f"{args.n} runs of {args.mib} MiB; volume {vol.volume_id}")
        print(f"{'':<40}{'p50 ms':>10}{'p99 ms':>10}{'MB/s':>10}   target")
        report("SDK write_file (PUT)", timed(args.n, sdk_put), size, "sdk_put")
        report("SDK read_file bytes (GET)", timed(args.n, sdk_get_bytes), size, "sdk_get")
        report("SDK read_file stream (GET)", timed(args.n, sdk_get_stream), size, "sdk_stream")
        report("httpx PUT, streamed body", timed(args.n, raw_put), size, "raw_put")
        report("httpx GET, streamed, sha256 checked", timed(args.n, raw_get), size, "raw_get")
        growth = (rss_of(dataplane) - rss_before) / MiB
        print(f"data plane RSS growth over the run: {growth:.1f} MiB")
        figure("volume_content.rss_growth_mib", growth)
        http.close()
        Volume.destroy(vol.volume_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
