"""Resource limits hold: a fork bomb and a memory hog stay inside their sandbox."""

from __future__ import annotations

import subprocess
import threading
import time

from e2bfacade.runtime.base import SandboxSpec
from e2bfacade.runtime.local import LocalRuntime
from tests.runtime.helpers import (
    MiB,
    cgroup_file,
    cgroup_pids,
    gone_or_reused,
    ok,
    proc_state,
    run,
    sh,
)
from tests.support.waiting import eventually


def test_a_fork_bomb_stays_within_pids_max(runtime: LocalRuntime, sandbox_id: str) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base", memory_mb=128, pids_max=64))
    current = cgroup_file(runtime, sandbox_id, "pids", "pids.current")
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, int(current.read_text()))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        # Bounded: 200 sleepers against a limit of 64. They outlive the shell (their output
        # goes to /dev/null so the exec returns), and the guest keeps hitting the wall.
        result = sh(
            runtime,
            sandbox_id,
            "for i in $(seq 200); do sleep 30 >/dev/null 2>&1 & done; echo spawned",
            timeout=15,
        )
        assert b"fork" in result.stderr.lower(), result  # some forks were refused
        time.sleep(0.2)
    finally:
        done.set()
        sampler.join()
    # A refused fork is charged and then uncharged (the kernel's pids_try_charge adds, sees
    # the limit passed, and takes it back), so a sample can catch limit + 1 for an instant;
    # no task beyond the limit ever exists.
    assert 32 < peak <= 64 + 1, peak
    assert int(current.read_text()) <= 64
    events = cgroup_file(runtime, sandbox_id, "pids", "pids.events").read_text()
    assert int(events.split()[1]) > 0, f"the limit was never hit: {events}"
    # The host and its other processes keep working.
    assert subprocess.run(["true"]).returncode == 0

    victims = cgroup_pids(runtime, sandbox_id)
    starts = {pid: (proc_state(pid) or ("", None))[1] for pid in victims}
    assert len(victims) > 32
    assert runtime.kill(sandbox_id) is True
    eventually(
        lambda: [(p, proc_state(p)) for p in victims if not gone_or_reused(p, starts[p])],
        until=lambda left: not left,
        within=5,
        what="every guest process reaped",
    )


def test_a_memory_hog_is_oom_killed_within_its_limit(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base", memory_mb=64, pids_max=64))
    # Touch every page: an untouched calloc'd bytearray would never be charged.
    result = run(
        runtime,
        sandbox_id,
        ["python3", "-c", "b = bytearray(b'x') * (256 * 1024 * 1024); print(len(b))"],
        timeout=30,
    )
    assert result.exit_code == 137, result  # SIGKILL from the OOM killer
    assert result.stdout == b""
    limit = 64 * MiB
    max_usage = (
        int(cgroup_file(runtime, sandbox_id, "memory", "memory.max_usage_in_bytes").read_text())
        if runtime.cgroups.version == 1
        else int(cgroup_file(runtime, sandbox_id, "memory", "memory.peak").read_text())
    )
    assert 0 < max_usage <= limit
    # The sandbox itself survives its guest's OOM kill.
    assert ok(runtime, sandbox_id, "echo alive").strip() == "alive"


def test_metrics_report_the_sandbox_limits_and_usage(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base", cpu_count=2, memory_mb=64, pids_max=64))
    ok(runtime, sandbox_id, "head -c 4000000 /dev/urandom > /tmp/blob")
    m = runtime.metrics(sandbox_id)
    assert m.cpu_count == 2
    assert m.mem_total == 64 * MiB
    assert m.mem_used > 0
    assert m.cpu_usage_ns > 0
    assert m.disk_used >= 4_000_000
    assert m.pids >= 1
