"""What a transform rule over HTTPS and an egressProxy cost a sandbox, measured on this
host against the test internet (tests/support/internet.py: a namespace of this machine; no
packet leaves it).

    sudo .venv/bin/python bench/egress_tls_bench.py [--n 200]

From inside the sandboxes, interleaved, ``--n`` HTTPS GETs each (connect, TLS handshake,
request, read to the end; fresh connections, then ``--n`` more on one kept-alive
connection per path) to: ``allowed.example`` with a transform rule (the proxy terminates
TLS with a certificate it minted, verifies the destination, rewrites the request),
``other.example`` through the proxy without a rule (diverted, routed by the TLS server
name, relayed untouched), the same address from a sandbox without domain rules (the
kernel's path only), and ``other.example`` from a sandbox whose ``egressProxy`` is a
SOCKS5 server on the test internet (Debian's dante, tests/support/socks.py). Then the cost
of minting one certificate (``tls.Authority``) and of a cached lookup. Medians and p99s,
in milliseconds. The rule's header is static: resolving a secret is a database read (two
indexed queries) on top.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.egress_bench import PROXY_PORT, destroy, row, start_proxy  # noqa: E402
from bench.stats import percentile  # noqa: E402
from e2bfacade.runtime.base import (  # noqa: E402
    BUILTIN_IMAGE,
    NetworkPolicy,
    ProcessSpec,
    SandboxSpec,
    UpstreamProxy,
)
from e2bfacade.runtime.guest import run_process  # noqa: E402
from e2bfacade.runtime.local import LocalRuntime  # noqa: E402
from e2bfacade.runtime.local.net.rules import NetworkConfig  # noqa: E402
from e2bfacade.runtime.local.net.tls import Authority  # noqa: E402
from tests.support.internet import TestInternet  # noqa: E402
from tests.support.socks import Dante  # noqa: E402

OTHER = "203.0.113.30"  # other.example
GUEST = r"""
import http.client, json, socket, ssl, sys, time
host, address, n, keep = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
context = ssl.create_default_context()  # the sandbox's bundle: the proxy's CA is in it

def connect():
    conn = http.client.HTTPSConnection(host, 443, timeout=10)
    raw = socket.create_connection((address, 443), timeout=10)
    conn.sock = context.wrap_socket(raw, server_hostname=host)
    return conn

took, conn = [], None
for _ in range(n):
    t = time.perf_counter()
    if conn is None or not keep:
        conn = connect()
    conn.request("GET", "/")
    conn.getresponse().read()
    if not keep:
        conn.close()
    took.append((time.perf_counter() - t) * 1000)
print(json.dumps(took))
"""


def requests(
    rt: LocalRuntime, sid: str, host: str, address: str, n: int, keep: bool
) -> list[float]:
    argv = ("python3", "-c", GUEST, host, address, str(n), "1" if keep else "0")
    done = run_process(rt.guest(sid), ProcessSpec(argv=argv, timeout=600))
    if done.exit_code != 0:
        raise RuntimeError(done.stderr.decode(errors="replace")[-2000:])
    took: list[float] = json.loads(done.stdout)
    return took


def minting(root: Path, n: int, prefix: str = "") -> tuple[list[float], list[float]]:
    authority = Authority(root)
    minted, cached = [], []
    for i in range(n):
        t = time.perf_counter()
        authority.context(f"{prefix}host{i}.example")
        minted.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        authority.context(f"{prefix}host{i}.example")
        cached.append((time.perf_counter() - t) * 1000)
    return minted, cached


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    with TestInternet() as internet:
        config = NetworkConfig(
            uplink=internet.uplink,
            gateway=internet.gateway,
            cidr="10.198.64.0/18",
            proxy_port=PROXY_PORT,
            extra_ca=str(internet.ca_path),
        )
        rt = LocalRuntime(Path(tempfile.mkdtemp(prefix="e2bn-", dir="/tmp")), network=config)
        proxy = None
        socks = Dante(internet, "203.0.113.40")
        try:
            socks.__enter__()
            rt.ensure_base_image()
            proxy = start_proxy(rt.root)
            ruled = NetworkPolicy(
                allow_internet=True,
                allow_out=("allowed.example", "other.example"),
                deny_out=("0.0.0.0/0",),
                transforms=(("allowed.example", (("X-Bench", "static"),)),),
            )
            rt.create(SandboxSpec("egresstlsp", BUILTIN_IMAGE, network=ruled))
            rt.create(
                SandboxSpec("egresstlsd", BUILTIN_IMAGE, network=NetworkPolicy(allow_internet=True))
            )
            tunnelled = NetworkPolicy(
                allow_internet=True,
                allow_out=("other.example",),
                deny_out=("0.0.0.0/0",),
                upstream=UpstreamProxy(f"{socks.address}:{socks.port}"),
            )
            rt.create(SandboxSpec("egresstlss", BUILTIN_IMAGE, network=tunnelled))
            cases = (
                ("rule: intercepted (TLS ended, rewritten)", "egresstlsp", "allowed.example"),
                ("no rule: through the proxy, untouched", "egresstlsp", "other.example"),
                ("no domain rules: kernel only (baseline)", "egresstlsd", "other.example"),
                ("egressProxy: tunnelled through SOCKS5 by name", "egresstlss", "other.example"),
            )
            address = {"allowed.example": "203.0.113.10", "other.example": OTHER}
            for keep in (False, True):
                label = "one kept-alive connection" if keep else "fresh connections"
                print(f"HTTPS GETs from a sandbox, {label}, {args.n} each (interleaved)")
                results: dict[str, list[float]] = {name: [] for name, _, _ in cases}
                for _name, sid, host in cases:  # warm: the first certificate is minted here
                    requests(rt, sid, host, address[host], 5, keep)
                for _ in range(4):
                    for name, sid, host in cases:
                        results[name] += requests(rt, sid, host, address[host], args.n // 4, keep)
                for name, values in results.items():
                    print(row(name, values))
            minted, cached = minting(rt.root, 200)
            print("certificates (tls.Authority), 200 names")
            print(row("mint one (first request to a name)", minted))
            print(row("cached", cached))
            print(f"  (p50 of mint: {percentile(minted, 50):.3f} ms)")
        finally:
            if proxy is not None:
                proxy.kill()
                proxy.wait()
            socks.__exit__()
            destroy(rt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
