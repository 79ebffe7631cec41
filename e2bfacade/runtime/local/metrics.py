"""A local sandbox's metrics: CPU, memory and pids from its cgroups, disk from its own file
system; CPU as a share of its CPUs over the interval since the previous sample."""

from __future__ import annotations

import os
import time
from pathlib import Path

from e2bfacade.runtime.base import LimitEvents, Metrics, PauseMode, SandboxInfo
from e2bfacade.runtime.local.cgroups import Cgroups
from e2bfacade.runtime.local.storage import disks


def sample(cgroups: Cgroups, sandbox_dir: Path, info: SandboxInfo) -> Metrics:
    if info.pause_mode is PauseMode.FILESYSTEM:  # no processes: nothing runs or is held
        mounted = os.path.ismount(sandbox_dir / disks.MOUNT)
        used, total = disks.usage(sandbox_dir) if mounted else (0, 0)
        return Metrics(info.cpu_count, 0.0, 0, 0, info.memory_mb << 20, 0, used, total, 0)
    cpu_ns, mem_used, cache, limit = cgroups.stats(info.sandbox_id)
    now = time.time()
    sample_file = sandbox_dir / "cpu.sample"
    try:
        prev_t, prev_ns = (float(x) for x in sample_file.read_text().split())
    except (FileNotFoundError, ValueError):
        prev_t, prev_ns = info.created_at, 0.0
    sample_file.write_text(f"{now} {cpu_ns}")
    elapsed = max(now - prev_t, 1e-6)
    pct = 100.0 * (cpu_ns - prev_ns) / 1e9 / elapsed / info.cpu_count
    disk_used, disk_total = disks.usage(sandbox_dir)
    return Metrics(
        cpu_count=info.cpu_count,
        cpu_used_pct=round(max(0.0, min(pct, 100.0)), 2),
        cpu_usage_ns=cpu_ns,
        mem_used=mem_used,
        mem_total=limit,
        mem_cache=cache,
        disk_used=disk_used,
        disk_total=disk_total,
        pids=len(cgroups.pids(info.sandbox_id)),
    )


def limit_events(cgroups: Cgroups, sandbox_id: str) -> LimitEvents:
    """The sandbox's groups' counters of the limits it met (zeros once they are gone: a
    filesystem pause or a crash ends them, and a boot starts them afresh)."""
    if not cgroups.exists(sandbox_id):
        return LimitEvents()
    oom, pids = cgroups.limit_events(sandbox_id)
    return LimitEvents(oom_kills=oom, pid_limit_hits=pids)
