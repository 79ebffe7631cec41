"""What a connection through the egress proxy costs a sandbox, measured on this host against
the test internet (tests/support/internet.py: a namespace of this machine; no packet leaves
it).

    sudo .venv/bin/python bench/egress_bench.py [--n 300]

From inside one sandbox, ``--n`` HTTP requests on fresh connections (connect, GET, read to
the end) for each of: an allowed domain (``allowed.example``: diverted to the proxy, matched
by its Host header, resolved and dialled by the proxy), an allowed CIDR on a proxied sandbox
(diverted, judged by address, dialled), and the same address from a sandbox with no domain
rules (the kernel's path only, the baseline). Medians and p99s, in milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import percentile  # noqa: E402
from e2bfacade.runtime.base import (  # noqa: E402
    BUILTIN_IMAGE,
    NetworkPolicy,
    ProcessSpec,
    SandboxSpec,
)
from e2bfacade.runtime.guest import run_process
from e2bfacade.runtime.local import LocalRuntime, lxcfs  # noqa: E402
from e2bfacade.runtime.local.net import accounts  # noqa: E402
from e2bfacade.runtime.local.net.network import digest_of  # noqa: E402
from e2bfacade.runtime.local.net.rules import NetworkConfig  # noqa: E402
from tests.support.internet import TestInternet  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OTHER = "203.0.113.30"  # other.example
PROXY_PORT = 49978
GUEST = r"""
import json, socket, sys, time
host, address, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
request = f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
took = []
for _ in range(n):
    t = time.perf_counter()
    s = socket.create_connection((address, 80), timeout=10)
    s.sendall(request)
    while s.recv(65536):
        pass
    s.close()
    took.append((time.perf_counter() - t) * 1000)
print(json.dumps(took))
"""


def requests(rt: LocalRuntime, sid: str, host: str, address: str, n: int) -> list[float]:
    done = run_process(
        rt.guest(sid),
        ProcessSpec(argv=("python3", "-c", GUEST, host, address, str(n)), timeout=600),
    )
    if done.exit_code != 0:
        raise RuntimeError(done.stderr.decode(errors="replace")[-2000:])
    took: list[float] = json.loads(done.stdout)
    return took


def row(name: str, values: list[float]) -> str:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return f"  {name:<44} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms"


def start_proxy(root: Path) -> subprocess.Popen[bytes]:
    proxy = subprocess.Popen(
        [sys.executable, "-m", "e2bfacade.runtime.local.net.egress", str(root)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=open(root / "egress.log", "wb"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proxy.poll() is None:
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", PROXY_PORT), timeout=1).close()
            return proxy
        time.sleep(0.05)
    raise RuntimeError((root / "egress.log").read_text())


def destroy(rt: LocalRuntime) -> None:
    rt.discard_spares()
    for info in rt.list():
        rt.kill(info.sandbox_id)
    if rt.network is not None:
        rt.network.teardown()
    # The root's launcher daemon: its binary lives under the root.
    prefix = os.fsencode(rt.root / "bin") + b"/"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(prefix):
                os.kill(int(pid), signal.SIGKILL)
    # Its lxcfs (a FUSE mount under the root) and the guard of its addresses: both
    # outlived the bench before, as the suite's destroy_runtime removes them.
    lxcfs.stop(rt.root)
    accounts.remove(digest_of(rt.root))
    shutil.rmtree(rt.root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    with TestInternet() as internet:
        config = NetworkConfig(
            uplink=internet.uplink,
            gateway=internet.gateway,
            cidr="10.198.0.0/18",
            proxy_port=PROXY_PORT,
        )
        rt = LocalRuntime(Path(tempfile.mkdtemp(prefix="e2bn-", dir="/tmp")), network=config)
        proxy = None
        try:
            rt.ensure_base_image()
            proxy = start_proxy(rt.root)
            proxied = NetworkPolicy(
                allow_internet=True, allow_out=("allowed.example", OTHER), deny_out=("0.0.0.0/0",)
            )
            rt.create(SandboxSpec("egressbenchp", BUILTIN_IMAGE, network=proxied))
            rt.create(
                SandboxSpec(
                    "egressbenchd", BUILTIN_IMAGE, network=NetworkPolicy(allow_internet=True)
                )
            )
            print(f"HTTP requests on fresh connections from a sandbox, {args.n} each")
            cases = (
                ("allowed domain, through the proxy", "egressbenchp", "allowed.example", OTHER),
                ("allowed CIDR, through the proxy", "egressbenchp", OTHER, OTHER),
                ("no domain rules, kernel only (baseline)", "egressbenchd", OTHER, OTHER),
            )
            for name, sid, host, address in cases:
                requests(rt, sid, host, address, 10)  # warm: the first connections of each path
                print(row(name, requests(rt, sid, host, address, args.n)))
        finally:
            if proxy is not None:
                proxy.kill()
                proxy.wait()
            destroy(rt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
