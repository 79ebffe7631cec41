"""``/health`` and a create, idle and under half-sent requests held open (slowloris), for
``manage.py serve`` with its front (nginx before gunicorn) and without (``--no-front``:
gunicorn's sync workers on the port, as before the front), side by side in one run.

    .venv/bin/python bench/slowloris_bench.py [--held 500] [--rounds 3] [--n 40]
        [--creates 5] [--workers 4] [--timeout 5] [--old-loaded 1] [--sqlite]

Starts two deployments (each a fresh database, on DATABASE_URL's PostgreSQL server or
SQLite files, and a fresh SANDBOX_ROOT; needs root) and one serve on each, ``--workers``
gunicorn workers apiece. Each round measures both idle (requests to the two in turn), then
loaded: an attacker holds ``--held`` connections open on each serve, every one having sent
``GET /health HTTP/1.1`` and a Host header but never the blank line that ends the headers,
and opens a new one for every one the server closes; meanwhile the fronted serve gets as
many requests as idle, and the bare gunicorn ``--old-loaded`` of each kind, each given up
after ``--timeout`` s (there they queue behind the held connections, each of which holds a
worker until gunicorn's timeout, 60 s, kills it). Each create's sandbox is killed after it,
untimed. Target: with the front, p50 and p99 under load within 2x of idle.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from bench.stats import database_url, figure, percentile  # noqa: E402
from tests.faults.test_supervision import Serve  # noqa: E402
from tests.support.live_server import Deployment, TeamKey  # noqa: E402

HALF_REQUEST = b"GET /health HTTP/1.1\r\nHost: bench\r\n"  # no final CRLF
# The attacker stops here however the measurement goes: every loop of it is bounded.
ATTACK_SECONDS_MAX = 900


class Attacker:
    """``held`` half-sent requests kept open on each of ``ports`` from one thread: a
    connection the server closes (nginx's client_header_timeout, gunicorn's worker
    timeout) is replaced by a new one, as a slowloris client does."""

    def __init__(self, ports: list[int], held: int) -> None:
        self.ports, self.held = ports, held
        self.selector = selectors.DefaultSelector()
        self.stopping = threading.Event()
        self.opened = 0
        self.closed_by_server = dict.fromkeys(ports, 0)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, port: int) -> None:
        conn = socket.create_connection(("127.0.0.1", port), timeout=10)
        conn.sendall(HALF_REQUEST)
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, port)
        self.opened += 1

    def start(self) -> None:
        for port in self.ports:
            for _ in range(self.held):
                self._open(port)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + ATTACK_SECONDS_MAX
        while not self.stopping.is_set() and time.monotonic() < deadline:
            for key, _ in self.selector.select(timeout=0.2):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    if conn.recv(65536):
                        continue  # an answer (nginx's 408 is none: it just closes)
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                self.selector.unregister(conn)
                conn.close()
                self.closed_by_server[key.data] += 1
                self._open(key.data)

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()


def timed(call: Callable[[], httpx.Response], ok: int) -> float | None:
    """Milliseconds ``call`` took, or None when it timed out."""
    started = time.perf_counter()
    try:
        answer = call()
    except httpx.TimeoutException:
        return None
    took = (time.perf_counter() - started) * 1000
    assert answer.status_code == ok, answer.text
    return took


class Target:
    """One serve, its client and its team."""

    def __init__(self, name: str, serve: Serve, team: TeamKey, timeout: float) -> None:
        self.name, self.serve = name, serve
        self.client = httpx.Client(
            base_url=serve.url, headers={"X-API-Key": team.api_key}, timeout=timeout
        )

    def health(self) -> float | None:
        return timed(lambda: self.client.get("/health"), 200)

    def create(self) -> float | None:
        body = {"templateID": "base", "timeout": 120}
        started = time.perf_counter()
        try:
            answer = self.client.post("/v2/sandboxes", json=body)
        except httpx.TimeoutException:
            return None
        took = (time.perf_counter() - started) * 1000
        assert answer.status_code == 201, answer.text
        self.client.delete(f"/sandboxes/{answer.json()['sandboxID']}", timeout=60)
        return took


Samples = dict[tuple[str, str, str], list[float | None]]


def measure(samples: Samples, phase: str, targets: list[Target], n: int, creates: int) -> None:
    """``n`` /health and ``creates`` creates of each target, the targets in turn."""
    for i in range(max(n, creates)):
        for target in targets:
            if i < n:
                samples.setdefault((target.name, phase, "/health"), []).append(target.health())
            if i < creates:
                samples.setdefault((target.name, phase, "create"), []).append(target.create())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--held", type=int, default=500, help="half-sent requests per serve")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of idle, then loaded")
    parser.add_argument("--n", type=int, default=40, help="/health requests per round")
    parser.add_argument("--creates", type=int, default=5, help="creates per round")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers per serve")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds before giving up")
    parser.add_argument(
        "--old-loaded",
        type=int,
        default=1,
        help="requests of each kind to the bare gunicorn per loaded round",
    )
    parser.add_argument("--sqlite", action="store_true")
    args = parser.parse_args()
    # The sandboxes made need no network, and two roots' networks would need two ranges.
    os.environ["SANDBOX_UPLINK"] = "none"
    suite = database_url(args.sqlite)
    postgres = not args.sqlite
    with (
        Deployment(postgres=postgres, teams=1, prefix="e2bsl", suite_url=suite) as new_dep,
        Deployment(postgres=postgres, teams=1, prefix="e2bsl", suite_url=suite) as old_dep,
    ):
        serves = {"front": Serve(new_dep), "no front": Serve(old_dep)}
        try:
            serves["front"].start("--workers", str(args.workers))
            serves["no front"].start("--workers", str(args.workers), "--no-front")
            for serve in serves.values():
                serve.wait_ready()
            new = Target("front", serves["front"], new_dep.take_team(), args.timeout)
            old = Target("no front", serves["no front"], old_dep.take_team(), args.timeout)
            samples: Samples = {}
            measure(samples, "warm-up", [new, old], 10, 5)
            loaded = f"{args.held} held"
            # Idle and loaded in turn, so that the machine's drift (and the pools' warming)
            # falls on both alike.
            for _ in range(args.rounds):
                measure(samples, "idle", [new, old], args.n, args.creates)
                attacker = Attacker([new.serve.port, old.serve.port], args.held)
                attacker.start()
                try:
                    time.sleep(1.0)  # every held connection accepted
                    measure(samples, loaded, [new], args.n, args.creates)
                    measure(samples, loaded, [old], args.old_loaded, args.old_loaded)
                finally:
                    attacker.stop()
                closed = attacker.closed_by_server
                print(
                    f"round: {attacker.opened} connections opened; closed by the server: "
                    f"{closed[new.serve.port]} (front), {closed[old.serve.port]} (no front)",
                    flush=True,
                )
            report(samples, loaded, args)
        finally:
            for serve in serves.values():
                serve.stop()
                serve.kill_leftovers()


def report(samples: Samples, loaded: str, args: argparse.Namespace) -> None:
    print(
        f"serve --workers {args.workers}; {args.rounds} rounds; "
        f"a request is given up after {args.timeout:g} s"
    )
    print(f"{'serve':<10}{'phase':<11}{'request':<9}{'n':>5}{'p50 ms':>9}{'p99 ms':>9}{'lost':>6}")
    stats: dict[tuple[str, str, str], tuple[float, float]] = {}
    for (name, phase, what), values in samples.items():
        if phase == "warm-up":
            continue
        done = [v for v in values if v is not None]
        lost = len(values) - len(done)
        cells = f"{'-':>9}{'-':>9}"
        if done:
            p50, p99 = statistics.median(done), percentile(done, 99)
            cells = f"{p50:9.1f}{p99:9.1f}"
            if not lost:
                stats[(name, phase, what)] = (p50, p99)
        print(f"{name:<10}{phase:<11}{what:<9}{len(values):>5}{cells}{lost:>6}")
    for what, kind in (("/health", "health"), ("create", "create")):
        idle, under = stats.get(("front", "idle", what)), stats.get(("front", loaded, what))
        if idle and under:
            p50_ratio, p99_ratio = under[0] / idle[0], under[1] / idle[1]
            print(
                f"front, {what}: under load / idle = {p50_ratio:.2f} (p50), {p99_ratio:.2f} (p99)"
            )
            figure(f"slowloris_front_{kind}_loaded_over_idle_p50", p50_ratio)
            figure(f"slowloris_front_{kind}_loaded_over_idle_p99", p99_ratio)


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("slowloris_bench: needs root (the servers' sandbox runtime)")
    main()
