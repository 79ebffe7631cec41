"""The data plane through the real E2B Python SDK, against a real server.

    .venv/bin/python bench/dataplane_bench.py [--n 100] [--sqlite] [--streams 100]

Starts its own API, data plane (2 uvicorn workers) and lifecycle worker on a fresh database
(the PostgreSQL server of DATABASE_URL, or SQLite with --sqlite) and SANDBOX_ROOT; needs
root. Prints medians and p99s of ``commands.run("true")`` and of the time to the first
stdout byte; stdout throughput (one command writing 1 GiB to stdout, read through the SDK)
and the data plane's memory growth meanwhile; ``files.write``/``read`` of 1 MiB and 100 MiB;
and ``GET /sandboxes/{id}`` p99 idle and while ``--streams`` long-running streams follow
commands in 20 sandboxes, side by side. Targets (docs/performance.md, "The data plane"): run("true")
p50 <= 15 ms, stdout and files >= 200 MB/s, memory growth <= 64 MiB, GET p99 under streams
<= 2x idle.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2b import Sandbox  # noqa: E402

from tests.support.live_server import live_server  # noqa: E402

MiB = 1 << 20
# Run in a child process: start N streams over the given sandboxes and follow them.
FOLLOW = """
import sys, threading
from e2b import Sandbox
n, ids = int(sys.argv[1]), sys.argv[2:]
boxes = [Sandbox.connect(i) for i in ids]
# Twenty lines a second each, without forking a sleep per line (read -t on a FIFO waits).
TICK = "f=$(mktemp -u); mkfifo $f; exec 3<>$f; while true; do echo tick; read -t 0.05 -u 3; done"
handles = [boxes[k % len(boxes)].commands.run(TICK, background=True, timeout=0) for k in range(n)]
def follow(h):
    try:
        for _ in h:
            pass
    except Exception:
        pass
for h in handles:
    threading.Thread(target=follow, args=(h,), daemon=True).start()
print("following", flush=True)
threading.Event().wait()
"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def line(name: str, ms: list[float], target: str = "") -> None:
    print(f"{name:<44}{statistics.median(ms):>9.2f}{pct(ms, 99):>9.2f}   {target}")


def rss_of(pid: int) -> int:
    """Resident bytes of a process and its children (the data plane's workers)."""
    out = subprocess.run(
        ["ps", "-o", "rss=", "--ppid", str(pid), "-p", str(pid)], capture_output=True, text=True
    )
    return sum(int(x) for x in out.stdout.split()) * 1024


def timed(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--streams", type=int, default=100)
    args = parser.parse_args()
    if args.sqlite:
        where = tempfile.mkdtemp(prefix="e2bb-")
        atexit.register(shutil.rmtree, where, True)  # the database goes with the bench
        db = f"sqlite:///{where}/bench.sqlite3"
    else:
        db = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/e2bfacade")
    with live_server(db) as server:
        os.environ.update(
            E2B_API_URL=server.url, E2B_SANDBOX_URL=server.sandbox_url, E2B_API_KEY=server.api_key
        )
        os.environ.pop("E2B_DEBUG", None)
        sbx = Sandbox.create(timeout=3600)
        sbx.commands.run("true")  # warm-up
        print(f"{'what (ms)':<44}{'p50':>9}{'p99':>9}")
        line(
            'commands.run("true")',
            timed(lambda: sbx.commands.run("true"), args.n),
            "target p50 <= 15",
        )

        first: list[float] = []
        arrived: list[float] = []

        def on_first(_: str) -> None:
            arrived.append(time.perf_counter())

        for _ in range(args.n // 2):
            arrived.clear()
            t = time.perf_counter()
            sbx.commands.run("echo x", on_stdout=on_first)
            first.append((arrived[0] - t) * 1000)
        line("time to the first stdout byte", first)

        # Throughput: 1 GiB of stdout, counted by a callback (the SDK decodes it as text).
        dataplane = server.dataplane.pid  # type: ignore[union-attr]
        before = rss_of(dataplane)
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_of(dataplane))
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        counted = [0]
        t = time.perf_counter()
        sbx.commands.run(
            "head -c 1073741824 /dev/zero | tr '\\0' a",
            on_stdout=lambda s: counted.__setitem__(0, counted[0] + len(s)),
            timeout=600,
        )
        seconds = time.perf_counter() - t
        stop.set()
        sampler.join()
        print(
            f"stdout: {counted[0] / MiB:.0f} MiB in {seconds:.2f} s = "
            f"{counted[0] / MiB / seconds:.0f} MiB/s (target >= 200 MB/s); data plane RSS "
            f"{before / MiB:.0f} -> peak {peak[0] / MiB:.0f} MiB (+{(peak[0] - before) / MiB:.0f}, "
            "target <= 64)"
        )

        for size in (1 * MiB, 100 * MiB):
            data = os.urandom(size)
            w = timed(
                lambda data=data: sbx.files.write("/tmp/bench.bin", data), 10 if size == MiB else 3
            )
            r = timed(
                lambda: sbx.files.read("/tmp/bench.bin", format="bytes"), 10 if size == MiB else 3
            )
            mb = size / MiB
            print(
                f"files {mb:.0f} MiB: write p50 {statistics.median(w):.1f} ms "
                f"({mb / statistics.median(w) * 1000:.0f} MiB/s), read p50 "
                f"{statistics.median(r):.1f} ms ({mb / statistics.median(r) * 1000:.0f} MiB/s)"
            )

        # The server alone: the same 1 GiB read by curl (a C client that decodes nothing),
        # counted on the wire; base64 makes the wire 4/3 of the output.
        envelope = json.dumps(
            {"process": {"cmd": "/bin/sh", "args": ["-c", "head -c 1073741824 /dev/zero"]}}
        ).encode()
        body = tempfile.NamedTemporaryFile(suffix=".bin", delete=False)
        body.write(b"\0" + struct.pack(">I", len(envelope)) + envelope)
        body.close()
        t = time.perf_counter()
        wire = subprocess.run(
            [
                "curl", "-s", "-o", "/dev/null", "-w", "%{size_download}",
                "-H", "Content-Type: application/connect+json",
                "-H", "Connect-Protocol-Version: 1",
                "-H", f"E2b-Sandbox-Id: {sbx.sandbox_id}",
                "-H", f"X-Access-Token: {sbx._envd_access_token}",
                "--data-binary", f"@{body.name}",
                f"{server.sandbox_url}/process.Process/Start",
            ],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        seconds = time.perf_counter() - t
        os.unlink(body.name)
        out_mib = int(wire.stdout) * 3 / 4 / MiB
        print(
            f"stdout, server alone (curl): {out_mib:.0f} MiB in {seconds:.2f} s = "
            f"{out_mib / seconds:.0f} MiB/s of output "
            f"({int(wire.stdout) / MiB / seconds:.0f} MiB/s on the wire)"
        )

        # The control plane's GET while many streams follow commands (followed by another
        # process, so that its threads do not compete with this one's for the GIL).
        http = httpx.Client(base_url=server.url, headers={"X-API-Key": server.api_key})
        idle = timed(lambda: http.get(f"/sandboxes/{sbx.sandbox_id}"), args.n)
        boxes = [Sandbox.create(timeout=600) for _ in range(20)]
        # The load's client runs at the lowest priority: in a deployment it is elsewhere,
        # here it shares the server's two cores.
        follower = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-c", FOLLOW, str(args.streams)]
            + [b.sandbox_id for b in boxes],
            env=os.environ.copy(),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert follower.stdout is not None
        assert follower.stdout.readline().strip() == "following", "the streams did not start"
        time.sleep(1)
        busy = timed(lambda: http.get(f"/sandboxes/{sbx.sandbox_id}"), args.n)
        follower.terminate()
        follower.wait()
        line("GET /sandboxes/{id}, idle", idle)
        line(
            f"GET /sandboxes/{{id}}, {args.streams} streams in 20 sandboxes",
            busy,
            f"p99 ratio {pct(busy, 99) / pct(idle, 99):.2f} (target <= 2)",
        )
        for box in boxes:
            box.kill()
        sbx.kill()


if __name__ == "__main__":
    main()
