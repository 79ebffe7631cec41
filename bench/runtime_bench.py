"""Latency and footprint of the local sandbox runtime, measured on this host.

    sudo .venv/bin/python bench/runtime_bench.py [--n 100] [--idle 20]

Runs ``--n`` iterations of create → pause → resume → snapshot → kill on a fresh temporary
SANDBOX_ROOT and prints the median and p99 of each step in milliseconds; then creates and
kills ``--n`` sandboxes "cold" (each step 150 ms after the one before, as interactive
creates arrive: the kernel's cgroup lock is then slow, see spares.py) and back to back,
with spare launchers and pooled disks (the default) and without (``spares=0``), side by
side; then starts ``--idle`` idle sandboxes and prints the memory each one costs, both as
charged to its cgroup and as the drop in the host's MemAvailable. Everything it made is
removed at the end. Targets (docs/performance.md, "The runtime": its budget): create p50
≤ 10 ms cold and back to back, pause/resume/kill p50 within 2× the figures before the
hardening (0.36 / 0.17 / 3.3 ms), idle memory ≤ 1 MB (the larger of the cgroup and
MemAvailable figures).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import percentile  # noqa: E402
from e2bfacade.runtime.base import SandboxSpec  # noqa: E402
from e2bfacade.runtime.local import LocalRuntime  # noqa: E402
from e2bfacade.runtime.local.cgroups import CgroupsV1  # noqa: E402
from tests.runtime.helpers import run

MiB = 1024 * 1024
OPS = ("create", "pause", "resume", "snapshot", "kill")
TARGETS_MS = {"create": 10.0, "pause": 0.72, "resume": 0.34, "kill": 6.6}
IDLE_TARGET_MB = 1.0
COLD_GAP_S = 0.15


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        out[name] = int(value.split()[0]) * 1024
    return out


def kernel_bytes(info: dict[str, int]) -> int:
    """Memory the kernel holds for processes and namespaces: slab, stacks, page tables."""
    return info["Slab"] + info["KernelStack"] + info["PageTables"]


def timed(fn, *args) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1000


def lifecycle(rt: LocalRuntime, n: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {op: [] for op in OPS}
    for i in range(n):
        sid, image = f"bench{i}", f"bench-snap{i}"
        samples["create"].append(timed(rt.create, SandboxSpec(sid, "base", memory_mb=256)))
        # A small change, so the snapshot archives something (not timed).
        run(rt, sid, ["sh", "-c", "echo state > /home/user/state"])
        samples["pause"].append(timed(rt.pause, sid))
        samples["resume"].append(timed(rt.resume, sid))
        samples["snapshot"].append(timed(rt.snapshot, sid, image))
        samples["kill"].append(timed(rt.kill, sid))
        rt.delete_image(image)
    return samples


def creates(rt: LocalRuntime, n: int, gap: float, tag: str) -> dict[str, list[float]]:
    """``n`` create + kill pairs, each call ``gap`` seconds after the previous one."""
    out: dict[str, list[float]] = {"create": [], "kill": []}
    for i in range(n):
        sid = f"{tag}{i}"
        time.sleep(gap)
        out["create"].append(timed(rt.create, SandboxSpec(sid, "base", memory_mb=256)))
        time.sleep(gap)
        out["kill"].append(timed(rt.kill, sid))
        time.sleep(0.02 if gap == 0 else 0)  # back to back, but let the pools refill
    return out


def idle_footprint(rt: LocalRuntime, count: int, rounds: int = 3) -> dict[str, list[float]]:
    """Per idle sandbox, in bytes: what its cgroup is charged (one value per sandbox), and
    per round of ``count`` creates the host's MemAvailable drop and kernel-memory growth
    divided by ``count`` (whole rounds, because one create moves MemAvailable by less than
    the noise of everything else running on the host)."""
    out: dict[str, list[float]] = {"cgroup": [], "available": [], "kernel": []}
    for r in range(rounds):
        ids = [f"idle{r}-{i}" for i in range(count)]
        time.sleep(0.3)
        before = meminfo()
        for sid in ids:
            rt.create(SandboxSpec(sid, "base", memory_mb=256))
        time.sleep(0.3)  # let the freshly started inits settle
        after = meminfo()
        out["available"].append((before["MemAvailable"] - after["MemAvailable"]) / count)
        out["kernel"].append((kernel_bytes(after) - kernel_bytes(before)) / count)
        out["cgroup"] += [float(rt.metrics(sid).mem_used) for sid in ids]
        for sid in ids:
            rt.kill(sid)
    return out


def cleanup(rt: LocalRuntime) -> None:
    rt.discard_spares()
    for sid in {p.name for p in (rt.root / "sandboxes").iterdir()} | rt.cgroups.list_ids():
        if not sid.startswith("."):
            rt.kill(sid)
    # The helper daemon this run started: the process whose command line names our socket.
    marker = str(rt.root / "run").encode()
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    # The group parent(s) named after this root: one per controller on v1, one on v2.
    cg = rt.cgroups
    parents = list(cg.roots.values()) if isinstance(cg, CgroupsV1) else [cg.root]  # type: ignore[attr-defined]
    time.sleep(0.05)
    for parent in parents:
        try:
            parent.rmdir()
        except OSError:
            pass
    shutil.rmtree(rt.root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="lifecycle iterations (100)")
    parser.add_argument("--idle", type=int, default=20, help="idle sandboxes to weigh (20)")
    args = parser.parse_args()

    rt = LocalRuntime(Path(tempfile.mkdtemp(prefix="e2bb-", dir="/tmp")))
    bare = LocalRuntime(Path(tempfile.mkdtemp(prefix="e2bb-", dir="/tmp")), spares=0)
    side: dict[str, dict[str, list[float]]] = {}
    try:
        for r in (rt, bare):
            r.ensure_base_image()
            # Warm-up, not measured: compiles the helper, starts its daemon, warms caches.
            for i in range(3):
                r.create(SandboxSpec(f"warm{i}", "base"))
                r.kill(f"warm{i}")
        samples = lifecycle(rt, args.n)
        for name, r in (("spares", rt), ("none", bare)):
            side[f"{name} cold"] = creates(r, args.n, COLD_GAP_S, "cold")
            side[f"{name} b2b"] = creates(r, args.n, 0.0, "b2b")
        idle = idle_footprint(rt, args.idle)
    finally:
        cleanup(rt)
        cleanup(bare)

    print(
        f"local runtime, {args.n} iterations, cgroup v{rt.cgroups.version}, "
        f"{os.cpu_count()} CPUs, kernel {os.uname().release}"
    )
    print(f"{'op':<10}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'target p50':>12}")
    verdicts = []
    for op in OPS:
        p50, p99 = statistics.median(samples[op]), percentile(samples[op], 99)
        target = TARGETS_MS.get(op)
        mark = "" if target is None else ("ok" if p50 <= target else "MISSED")
        if target is not None:
            verdicts.append(p50 <= target)
        print(
            f"{op:<10}{p50:>10.2f}{p99:>10.2f}{max(samples[op]):>10.2f}"
            f"{f'≤ {target:g} ms {mark}' if target else '':>12}"
        )
    print(
        f"create and kill, {args.n} each: cold ({COLD_GAP_S * 1000:.0f} ms apart) and back to back"
    )
    print(f"{'':<14}{'create p50':>12}{'p99':>8}{'kill p50':>10}{'p99':>8}")
    for name, got in side.items():
        c, k = got["create"], got["kill"]
        print(
            f"{name:<14}{statistics.median(c):>12.2f}{percentile(c, 99):>8.2f}"
            f"{statistics.median(k):>10.2f}{percentile(k, 99):>8.2f}"
        )
    verdicts += [
        statistics.median(side[k]["create"]) <= 10.0 for k in ("spares cold", "spares b2b")
    ]
    cg_mb = statistics.median(idle["cgroup"]) / MiB
    avail_mb = statistics.median(idle["available"]) / MiB
    kernel_mb = statistics.median(idle["kernel"]) / MiB
    print(
        f"idle memory per sandbox ({args.idle} sandboxes x 3 rounds): cgroup usage median "
        f"{cg_mb:.2f} MB (min {min(idle['cgroup']) / MiB:.2f}, max "
        f"{max(idle['cgroup']) / MiB:.2f}); host MemAvailable drop median {avail_mb:.2f} MB "
        f"(rounds: {', '.join(f'{v / MiB:.2f}' for v in idle['available'])}); host kernel "
        f"memory (slab+stacks+page tables) median {kernel_mb:.2f} MB"
    )
    verdicts.append(max(cg_mb, avail_mb) <= IDLE_TARGET_MB)
    med = {op: statistics.median(samples[op]) for op in OPS}
    print(
        f"SUMMARY create={med['create']:.1f}ms "
        f"cold={statistics.median(side['spares cold']['create']):.1f}ms"
        f"(no spares {statistics.median(side['none cold']['create']):.1f}ms) "
        f"pause={med['pause']:.2f}ms "
        f"resume={med['resume']:.2f}ms snapshot={med['snapshot']:.1f}ms kill={med['kill']:.1f}ms "
        f"idle={cg_mb:.2f}MB(cgroup)/{avail_mb:.2f}MB(MemAvailable)/{kernel_mb:.2f}MB(kernel) "
        f"targets={'met' if all(verdicts) else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
