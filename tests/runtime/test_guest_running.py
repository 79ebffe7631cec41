"""``Guest.running()``: what the data plane checks every second for each sandbox it has
requests open to, to cut them when the sandbox stops running (sandboxes/dataplane/liveness.py).
It answers for the sandbox as the guest resolved it, from the kernel's state alone."""

from __future__ import annotations

import time

from e2bfacade.runtime.base import SandboxSpec
from e2bfacade.runtime.local import LocalRuntime


def test_a_guest_stops_running_when_its_sandbox_is_paused_and_runs_again_when_resumed(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    guest = runtime.guest(sandbox_id)
    assert guest.running()
    runtime.pause(sandbox_id)
    assert not guest.running()
    runtime.resume(sandbox_id)  # the same init, thawed
    assert guest.running()


def test_a_guest_stops_running_for_good_when_its_init_ends(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    guest = runtime.guest(sandbox_id)
    runtime.pause(sandbox_id, memory=False)  # its processes end, its files are kept
    assert not guest.running()
    runtime.resume(sandbox_id)  # cold-booted: a new init, which the old guest is not
    assert not guest.running()
    booted = runtime.guest(sandbox_id)
    assert booted.running()
    runtime.kill(sandbox_id)
    assert not booted.running()


def test_a_check_costs_microseconds(runtime: LocalRuntime, sandbox_id: str) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    guest = runtime.guest(sandbox_id)
    checks = 2000
    started = time.perf_counter()
    for _ in range(checks):
        guest.running()
    each = (time.perf_counter() - started) / checks
    print(f"Guest.running(): {each * 1e6:.1f} µs per check")
    # Once a second per sandbox with open requests: even a loaded host stays far below.
    assert each < 1e-3
