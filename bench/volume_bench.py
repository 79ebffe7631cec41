"""What a volume mount adds to a sandbox's create, measured on this host.

    sudo .venv/bin/python bench/volume_bench.py [--n 100] [--volumes 1]

On a fresh temporary SANDBOX_ROOT (spare launchers and pooled disks on, the default),
creates and kills ``--n`` sandboxes without a volume and ``--n`` with ``--volumes`` of them
mounted, interleaved (one of each in turn, so both meet the same host), and prints the
median and p99 of create side by side, and the median of the pairwise differences (each
create with volumes less the one without just before it: robust to a host whose load
drifts). The volumes are made (and
mounted on the host) before the timed creates, as a service's are. Target: a mount adds
at most 2 ms to the median create. Everything it made is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.runtime_bench import cleanup, timed  # noqa: E402
from bench.stats import figure, percentile  # noqa: E402
from e2bfacade.runtime.base import SandboxSpec  # noqa: E402
from e2bfacade.runtime.local import LocalRuntime, lxcfs  # noqa: E402
from e2bfacade.runtime.volumes import VolumeMount  # noqa: E402

TARGET_MS = 2.0
GAP_S = 0.02  # between a kill and the next create: the pools refill


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="creates of each kind (100)")
    parser.add_argument("--volumes", type=int, default=1, help="volumes per sandbox (1)")
    args = parser.parse_args()

    rt = LocalRuntime(Path(tempfile.mkdtemp(prefix="e2bb-", dir="/tmp")))
    samples: dict[str, list[float]] = {"none": [], "volumes": []}
    kinds: list[tuple[str, tuple[VolumeMount, ...]]] = []
    try:
        rt.ensure_base_image()
        ids = [f"vol{i}" for i in range(args.volumes)]
        for volume_id in ids:
            rt.create_volume(volume_id, 64)
        mounts = tuple(VolumeMount(v, f"/mnt/{v}") for v in ids)
        # Warm-up, not measured: compiles the helper, starts its daemon, warms caches.
        for i in range(3):
            rt.create(SandboxSpec(f"warm{i}", "base", volume_mounts=mounts))
            rt.kill(f"warm{i}")
        kinds = [("none", ()), ("volumes", mounts)]
        for i in range(args.n):
            for kind, spec_mounts in kinds if i % 2 == 0 else kinds[::-1]:
                sid = f"{kind}{i}"
                spec = SandboxSpec(sid, "base", memory_mb=256, volume_mounts=spec_mounts)
                time.sleep(GAP_S)
                samples[kind].append(timed(rt.create, spec))
                rt.kill(sid)
    finally:
        cleanup(rt)
        lxcfs.stop(rt.root)  # the runtime's lxcfs, which cleanup leaves mounted
        shutil.rmtree(rt.root, ignore_errors=True)

    print(
        f"create with {args.volumes} volume(s) against none, {args.n} each, cgroup "
        f"v{rt.cgroups.version}, {os.cpu_count()} CPUs, kernel {os.uname().release}"
    )
    print(f"{'':<12}{'p50 ms':>10}{'p99 ms':>10}")
    for kind, got in samples.items():
        print(f"{kind:<12}{statistics.median(got):>10.2f}{percentile(got, 99):>10.2f}")
    added = statistics.median(samples["volumes"]) - statistics.median(samples["none"])
    pairs = [v - n for v, n in zip(samples["volumes"], samples["none"], strict=True)]
    per_mount = statistics.median(pairs) / max(1, args.volumes)
    print(
        f"difference of the medians {added:.2f} ms; median of the pairwise differences "
        f"{statistics.median(pairs):.2f} ms, per mount {per_mount:.2f} ms; target ≤ "
        f"{TARGET_MS:g} ms per mount: {'ok' if per_mount <= TARGET_MS else 'MISSED'}"
    )
    figure("runtime.volume_mount_create_ms", per_mount)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
