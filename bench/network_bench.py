"""What networking costs a sandbox, measured on this host against the test internet
(tests/support/internet.py: a namespace of this machine; no packet leaves it).

    sudo .venv/bin/python bench/network_bench.py [--n 100] [--cycles 1000]

1. Runtime create and kill, with networking (a veth pair, rules, resolv.conf) and without,
   side by side in one run, cold (150 ms apart, as interactive creates arrive) and back to
   back: medians and p99s, and the difference (networking's budget: setup ≤ 3 ms added to
   create's p50, teardown ≤ 2 ms); then a burst of creates with no kill between them.
2. TCP throughput from a sandbox to a host of the test internet (1 GiB, three runs; budget
   ≥ 1 Gbit/s).
3. ``--cycles`` create/kill cycles with networking, then what is left: interfaces, rule
   elements, slot records, ``ip rule`` lines (budget: nothing).
"""

from __future__ import annotations

import argparse
import shutil
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
from e2bfacade.runtime.local import LocalRuntime  # noqa: E402
from e2bfacade.runtime.local.net.rules import NetworkConfig  # noqa: E402
from tests.support.internet import SINK_PORT, TestInternet  # noqa: E402

COLD_GAP_S = 0.15
SEND = r"""
import socket, time
s = socket.create_connection(("203.0.113.10", PORT))
chunk = b"x" * (1 << 20)
t = time.perf_counter()
for _ in range(1024):
    s.sendall(chunk)
s.shutdown(socket.SHUT_WR)
s.recv(1)
print(1024 * 8 * (1 << 20) / (time.perf_counter() - t) / 1e9)
""".replace("PORT", str(SINK_PORT))


def runtime(network: NetworkConfig | None) -> LocalRuntime:
    rt = LocalRuntime(Path(tempfile.mkdtemp(prefix="e2bn-", dir="/tmp")), network=network)
    rt.ensure_base_image()
    return rt


def cycle(
    rt: LocalRuntime, n: int, gap: float, policy: NetworkPolicy, tag: str
) -> tuple[list[float], list[float]]:
    creates, kills = [], []
    for i in range(n):
        time.sleep(gap)
        sid = f"{tag}{i}"
        t = time.perf_counter()
        rt.create(SandboxSpec(sid, BUILTIN_IMAGE, network=policy))
        creates.append((time.perf_counter() - t) * 1000)
        time.sleep(gap)
        t = time.perf_counter()
        rt.kill(sid)
        kills.append((time.perf_counter() - t) * 1000)
    return creates, kills


def row(name: str, values: list[float]) -> str:
    return (
        f"  {name:<34} p50 {percentile(values, 50):7.2f} ms   p99 {percentile(values, 99):7.2f} ms"
    )


def destroy(rt: LocalRuntime) -> None:
    rt.discard_spares()
    for info in rt.list():
        rt.kill(info.sandbox_id)
    if rt.network is not None:
        rt.network.teardown()
    subprocess.run(["pkill", "-f", str(rt.root)], check=False)
    shutil.rmtree(rt.root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--cycles", type=int, default=1000)
    args = parser.parse_args()
    with TestInternet() as internet:
        config = NetworkConfig(
            uplink=internet.uplink, gateway=internet.gateway, cidr="10.199.0.0/18", proxy_port=49977
        )
        net, bare = runtime(config), runtime(None)
        try:
            print(f"create / kill, {args.n} each (with networking vs without, same run)")
            pair = (
                (net, "network", NetworkPolicy(allow_internet=True)),
                (bare, "loopback only", NetworkPolicy()),
            )
            for label, gap in (("cold", COLD_GAP_S), ("back to back", 0.0)):
                # Interleaved, one of each in turn, so drift in the machine's load falls on
                # both columns alike.
                got: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for _, k, _ in pair}
                for i in range(args.n):
                    for rt, kind, policy in pair:
                        c, k = cycle(rt, 1, gap, policy, f"b{label[0]}{kind[0]}{i}x")
                        got[kind][0].extend(c)
                        got[kind][1].extend(k)
                for _, kind, _ in pair:
                    print(row(f"create {label}, {kind}", got[kind][0]))
                    print(row(f"kill {label}, {kind}", got[kind][1]))
                for i, op in enumerate(("create", "kill")):
                    added = percentile(got["network"][i], 50) - percentile(
                        got["loopback only"][i], 50
                    )
                    print(f"  => networking adds {added:+.2f} ms to {op} p50 ({label})")

            print("a burst: creates back to back with no kill between them, then the kills")
            for rt, kind, policy in (
                (net, "network", NetworkPolicy(allow_internet=True)),
                (bare, "loopback only", NetworkPolicy()),
            ):
                burst_c, burst_k = [], []
                for i in range(min(args.n, 50)):
                    t = time.perf_counter()
                    rt.create(SandboxSpec(f"bb{kind[0]}{i}", BUILTIN_IMAGE, network=policy))
                    burst_c.append((time.perf_counter() - t) * 1000)
                for i in range(min(args.n, 50)):
                    t = time.perf_counter()
                    rt.kill(f"bb{kind[0]}{i}")
                    burst_k.append((time.perf_counter() - t) * 1000)
                print(row(f"create in a burst, {kind}", burst_c))
                print(row(f"kill in a burst, {kind}", burst_k))

            print("throughput, sandbox -> test internet (1 GiB per run)")
            net.create(
                SandboxSpec("bthru", BUILTIN_IMAGE, network=NetworkPolicy(allow_internet=True))
            )
            gbits = []
            for _ in range(3):
                out = run_process(
                    net.guest("bthru"),
                    ProcessSpec(argv=("python3", "-c", SEND), user="user", timeout=120),
                )
                gbits.append(float(out.stdout.decode().strip()))
            net.kill("bthru")
            runs = ", ".join(f"{g:.2f}" for g in gbits)
            print(f"  median {sorted(gbits)[1]:.2f} Gbit/s (runs: {runs})")

            print(f"{args.cycles} create/kill cycles, then what is left")
            assert net.network is not None
            rules_before = subprocess.run(["ip", "rule"], capture_output=True, text=True).stdout
            policies = [
                NetworkPolicy(allow_internet=True),
                NetworkPolicy(allow_internet=False),
                NetworkPolicy(allow_internet=True, allow_out=("1.1.1.1",), deny_out=("0.0.0.0/0",)),
            ]
            t = time.perf_counter()
            for i in range(args.cycles):
                net.create(SandboxSpec(f"bc{i}", BUILTIN_IMAGE, network=policies[i % 3]))
                net.kill(f"bc{i}")
            took = time.perf_counter() - t
            deadline = time.monotonic() + 30
            while net.network.interfaces() and time.monotonic() < deadline:
                time.sleep(0.1)
            rules_after = subprocess.run(["ip", "rule"], capture_output=True, text=True).stdout
            records = len(list(net.network.records.iterdir()))
            print(
                f"  {args.cycles} cycles in {took:.1f} s; left: {len(net.network.interfaces())} "
                f"interfaces, {net.network.elements()} rule elements, {records} slot records, "
                f"ip rules {'unchanged' if rules_before == rules_after else 'CHANGED'}"
            )
        finally:
            destroy(net)
            destroy(bare)
    return 0


if __name__ == "__main__":
    sys.exit(main())
