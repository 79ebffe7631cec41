"""One team attacking the data plane, another team's latency meanwhile, through the real
E2B Python SDK against a real server.

    .venv/bin/python bench/dataplane_dos_bench.py [--old-tree PATH] [--sqlite]
        [--n 100] [--seconds 30] [--uploads 2000] [--readers 200]

For this checkout (and, with ``--old-tree``, then for another checkout of e2bfacade, its
own code and server, on a database of its own), starts the API and lifecycle worker
(tests/support/live_server.py) and a data plane of ONE uvicorn worker with the default
settings (each worker has its own threads and shares), and a sandbox for each of teams A
and B. Then measures B's ``commands.run("true")``: idle; for ``--seconds`` while a separate
process holds ``--uploads`` half-sent uploads (``Content-Length: 100000000``, three bytes
sent) and ``--readers`` slow downloads (a 64 MiB file read at 16 bytes a second) on A's
sandbox, opening a new one whenever one is answered or cut; and after the attacker has
closed them (B, then A). Prints medians and p99s per checkout. Target: B's p99 under attack
<= 2x idle. Needs root. Every loop is bounded in count and time: a call that is not
answered in 10 s counts as a timeout, and three in a row end that phase.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

CALL_TIMEOUT = 10.0
TIMEOUTS_IN_A_ROW = 3
BIG_FILE = "/tmp/big"
BIG_BYTES = 64 << 20
READ_BYTES, READ_EVERY = 16, 1.0  # a slow reader's pace
OPENS_MAX = 100_000  # the attacker's connections in all, whatever the run's length


# ----------------------------------------------------------------------------- attacker
def _request(port: int, sandbox_id: str, token: str, line: str, extra: list[str]) -> bytes:
    head = [line, f"Host: 127.0.0.1:{port}", f"E2b-Sandbox-Id: {sandbox_id}"]
    head += [f"X-Access-Token: {token}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode()


def attack(port: int, sandbox_id: str, token: str, uploads: int, readers: int) -> None:
    """Hold ``uploads`` half-sent uploads and ``readers`` slow downloads open until SIGTERM,
    replacing each one the server answers or cuts; then close them all and print what the
    server answered, as JSON."""
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    upload = (
        _request(
            port,
            sandbox_id,
            token,
            "POST /files?path=/tmp/upload&username=user HTTP/1.1",
            ["Content-Type: application/octet-stream", "Content-Length: 100000000"],
        )
        + b"abc"
    )
    download = _request(
        port, sandbox_id, token, f"GET /files?path={BIG_FILE}&username=user HTTP/1.1", []
    )
    sel = selectors.DefaultSelector()
    slow: list[socket.socket] = []
    answers: Counter[str] = Counter()
    opens = 0

    def open_one(request: bytes, small_buffer: bool) -> socket.socket:
        nonlocal opens
        opens += 1
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if small_buffer:  # the server's sends block soon: the reader is slow
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        sock.setblocking(False)
        return sock

    for _ in range(uploads):
        sel.register(open_one(upload, False), selectors.EVENT_READ)
    for _ in range(readers):
        slow.append(open_one(download, True))
    print("ready", flush=True)
    next_read = time.monotonic()
    while not stop[0] and opens < OPENS_MAX:
        for key, _ in sel.select(0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            head = data.split(b"\r\n", 1)[0].split()
            answers[f"upload {head[1].decode()}" if len(head) > 1 else "upload cut"] += 1
            sel.unregister(sock)
            sock.close()
            sel.register(open_one(upload, False), selectors.EVENT_READ)
        if time.monotonic() >= next_read:
            next_read += READ_EVERY
            for i, sock in enumerate(slow):
                try:
                    if sock.recv(READ_BYTES):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                answers["download cut"] += 1
                sock.close()
                slow[i] = open_one(download, True)
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    for sock in slow:
        sock.close()
    print(json.dumps({"opens": opens, **answers}), flush=True)


# ------------------------------------------------------------------------ one checkout
def _calls(sbx: Any, *, n: int, seconds: float) -> dict[str, Any]:
    """``commands.run("true")`` up to ``n`` times or for ``seconds``, each bounded."""
    ms: list[float] = []
    timeouts = in_a_row = 0
    end = time.monotonic() + seconds
    while len(ms) + timeouts < n and time.monotonic() < end and in_a_row < TIMEOUTS_IN_A_ROW:
        started = time.perf_counter()
        try:
            sbx.commands.run("true", timeout=CALL_TIMEOUT, request_timeout=CALL_TIMEOUT)
        except Exception:  # noqa: BLE001 - any failure to answer counts, and ends a streak
            timeouts += 1
            in_a_row += 1
            continue
        in_a_row = 0
        ms.append((time.perf_counter() - started) * 1000)
    return {"ms": ms, "timeouts": timeouts}


def _dataplane(tree: Path, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    """The checkout's data plane, one worker, default settings, on ``port``."""
    import httpx

    env = {k: v for k, v in env.items() if not k.startswith("DATAPLANE_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "sandboxes.dataplane.server", "127.0.0.1", str(port), "1"],
        cwd=tree,
        env={**env, "DJANGO_SETTINGS_MODULE": "e2bfacade.settings"},
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("the data plane exited at start")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 400:
                return process
        time.sleep(0.1)
    raise SystemExit("the data plane did not start in 30 s")


def measure(tree: Path, database_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every phase on checkout ``tree`` (its own server code and live_server)."""
    sys.path.insert(0, str(tree))
    from e2b import Sandbox

    from tests.support.live_server import free_port, live_server

    with live_server(database_url) as server:
        port = free_port()
        dataplane = _dataplane(tree, server.env, port)
        try:
            os.environ.update(E2B_API_URL=server.url, E2B_SANDBOX_URL=f"http://127.0.0.1:{port}")
            os.environ.pop("E2B_DEBUG", None)
            a = Sandbox.create(api_key=server.api_key, timeout=3600)
            b = Sandbox.create(api_key=server.other_api_key, timeout=3600)
            a.commands.run(f"head -c {BIG_BYTES} /dev/zero > {BIG_FILE}", timeout=60)
            b.commands.run("true")  # warm-up
            out: dict[str, Any] = {"idle": _calls(b, n=args.n, seconds=120)}
            attacker = subprocess.Popen(
                [sys.executable, __file__, "--attack", str(port), a.sandbox_id]
                + [a._envd_access_token or "", str(args.uploads), str(args.readers)],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert attacker.stdout is not None
                if attacker.stdout.readline().strip() != "ready":
                    raise SystemExit("the attacker could not open its connections")
                out["attack"] = _calls(b, n=1_000_000, seconds=args.seconds)
            finally:
                attacker.send_signal(signal.SIGTERM)
                told, _ = attacker.communicate(timeout=60)
            out["attacker"] = json.loads(told.strip().splitlines()[-1])
            time.sleep(1)
            out["after B"] = _calls(b, n=args.n, seconds=60)
            out["after A"] = _calls(a, n=args.n, seconds=60)
            return out
        finally:
            dataplane.send_signal(signal.SIGTERM)
            try:
                dataplane.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(dataplane.pid, signal.SIGKILL)  # its own session only
                dataplane.wait(timeout=5)


# ------------------------------------------------------------------------------ report
def report(name: str, result: dict[str, Any]) -> None:
    sys.path.insert(0, str(REPO))
    from bench.stats import figure, percentile

    idle = result["idle"]["ms"]
    print(f"\n{name}")
    print(f"{'commands.run(true) (ms)':<28}{'n':>6}{'timeouts':>10}{'p50':>10}{'p99':>10}")
    for phase in ("idle", "attack", "after B", "after A"):
        ms, timeouts = result[phase]["ms"], result[phase]["timeouts"]
        p50 = f"{statistics.median(ms):10.2f}" if ms else f"{'-':>10}"
        p99 = f"{percentile(ms, 99):10.2f}" if ms else f"{'-':>10}"
        label = {"idle": "B idle", "attack": "B under attack"}.get(phase, phase)
        print(f"{label:<28}{len(ms):>6}{timeouts:>10}{p50}{p99}")
    print(f"attacker: {json.dumps(result['attacker'])}")
    attacked = result["attack"]["ms"]
    if idle and attacked and not result["attack"]["timeouts"]:
        ratio = percentile(attacked, 99) / percentile(idle, 99)
        print(f"B p99 under attack / idle: {ratio:.2f} (target <= 2)")
        figure(f"dataplane_dos_{name}_p99_ratio", ratio)
    else:
        print("B p99 under attack / idle: B was not answered under attack")


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--attack":
        port, sandbox_id, token, uploads, readers = sys.argv[2:]
        attack(int(port), sandbox_id, token, int(uploads), int(readers))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-tree", type=Path, help="another checkout, measured after this")
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--uploads", type=int, default=2000)
    parser.add_argument("--readers", type=int, default=200)
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)  # one checkout's run
    args = parser.parse_args()
    # The attacker's sockets and the data plane's (it inherits the limit).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * (args.uploads + args.readers) + 1024
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    if args.tree is not None:
        sys.path.insert(0, str(REPO))
        from bench.stats import database_url

        print("RESULT " + json.dumps(measure(args.tree, database_url(args.sqlite), args)))
        return
    # Each checkout in a process of its own: it imports its own e2bfacade.
    trees = [("new", REPO)] + ([("old", args.old_tree.resolve())] if args.old_tree else [])
    results = {}
    for name, tree in trees:
        child = [sys.executable, __file__, "--tree", str(tree), "--n", str(args.n)]
        child += ["--seconds", str(args.seconds), "--uploads", str(args.uploads)]
        child += ["--readers", str(args.readers)] + (["--sqlite"] if args.sqlite else [])
        run = subprocess.run(child, stdout=subprocess.PIPE, text=True, timeout=900, check=True)
        line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
        results[name] = json.loads(line.removeprefix("RESULT "))
    print(
        f"\none data-plane worker, default settings; attacker: {args.uploads} half-sent "
        f"uploads + {args.readers} slow readers on team A's sandbox for {args.seconds:g} s"
    )
    for name, result in results.items():
        report(name, result)


if __name__ == "__main__":
    main()
