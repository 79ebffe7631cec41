"""What a runtime measures of a sandbox (part of the interface, :mod:`.base`, which
re-exports them): its usage now, and the limits it met."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metrics:
    cpu_count: int
    cpu_used_pct: float
    cpu_usage_ns: int
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int
    pids: int


@dataclass(frozen=True)
class LimitEvents:
    oom_kills: int = 0  # processes the kernel killed for the memory limit
    pid_limit_hits: int = 0  # forks refused at the pids limit
