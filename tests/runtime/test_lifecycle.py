"""Pause, resume, kill, and what survives a restart of the service or of sandboxd."""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from e2bfacade.runtime.base import RuntimeConflict, SandboxSpec, SandboxState
from e2bfacade.runtime.local import LocalRuntime
from tests.runtime.helpers import (
    any_daemon_pids,
    buried,
    cgroup_dirs,
    cgroup_pids,
    cmdline,
    daemon_pids,
    gone_or_reused,
    mounts_mentioning,
    ok,
    parent_pid,
    proc_state,
    run,
    sh,
    sigkill_and_reap,
)
from tests.support.waiting import eventually, stays

COUNTER = (
    "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/c; sleep 0.01; done' "
    ">/dev/null 2>&1 &"
)


def read_counter(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


def test_pause_really_stops_the_guest(runtime: LocalRuntime, sandbox_id: str) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, COUNTER)
    counter = runtime.root / "sandboxes" / sandbox_id / "disk" / "upper" / "tmp" / "c"
    eventually(
        lambda: read_counter(counter) or 0,
        until=lambda n: n > 3,
        within=10,
        what="the counter running",
    )

    runtime.pause(sandbox_id)
    first = counter.read_text()
    stays(lambda: counter.read_text() != first, for_=0.3, what="the paused guest's counter moving")
    assert runtime.status(sandbox_id).state is SandboxState.PAUSED
    with pytest.raises(RuntimeConflict):
        run(runtime, sandbox_id, ["true"])
    with pytest.raises(RuntimeConflict):
        runtime.pause(sandbox_id)

    runtime.resume(sandbox_id)
    assert runtime.status(sandbox_id).state is SandboxState.RUNNING
    paused_at = int(first) if first.strip() else 0
    eventually(
        lambda: read_counter(counter) or 0,
        until=lambda n: n > paused_at + 3,
        within=10,
        what="the resumed guest's counter moving",
    )
    with pytest.raises(RuntimeConflict):
        runtime.resume(sandbox_id)


def test_kill_leaves_no_process_cgroup_or_mount_behind(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    info = runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, "sleep 60 >/dev/null 2>&1 & sleep 60 >/dev/null 2>&1 &")
    ok(runtime, sandbox_id, COUNTER)
    sandbox_dir = runtime.root / "sandboxes" / sandbox_id
    victims = cgroup_pids(runtime, sandbox_id)
    assert info.init_pid in victims and len(victims) >= 4
    starts = {pid: (proc_state(pid) or ("", None))[1] for pid in victims}
    assert all(d.is_dir() for d in cgroup_dirs(runtime, sandbox_id))
    assert mounts_mentioning(sandbox_dir)  # the probe sees the overlay while it lives

    assert runtime.kill(sandbox_id) is True

    assert not any(d.exists() for d in cgroup_dirs(runtime, sandbox_id))
    assert not sandbox_dir.exists()
    buried(runtime, sandbox_id)
    # Not even a zombie: the init and every guest process are reaped.
    eventually(
        lambda: [(p, proc_state(p)) for p in victims if not gone_or_reused(p, starts[p])],
        until=lambda left: not left,
        within=5,
        what="every guest process reaped",
    )
    assert mounts_mentioning(sandbox_dir) == []


def test_killing_an_unknown_sandbox_returns_false(runtime: LocalRuntime, sandbox_id: str) -> None:
    assert runtime.kill(sandbox_id) is False


def test_killing_twice_returns_true_then_false(runtime: LocalRuntime, sandbox_id: str) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    assert runtime.kill(sandbox_id) is True
    assert runtime.kill(sandbox_id) is False


def test_killing_a_paused_sandbox_works(runtime: LocalRuntime, sandbox_id: str) -> None:
    info = runtime.create(SandboxSpec(sandbox_id, "base"))
    start = proc_state(info.init_pid)[1]  # type: ignore[index]
    runtime.pause(sandbox_id)
    assert runtime.kill(sandbox_id) is True
    eventually(
        lambda: proc_state(info.init_pid),
        until=lambda state: state is None or state[1] != start,
        within=5,
        what="the init reaped",
    )
    assert not any(d.exists() for d in cgroup_dirs(runtime, sandbox_id))


def test_a_process_lifetime_ends_the_guest_command(runtime: LocalRuntime, sandbox_id: str) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    started = time.monotonic()
    result = run(runtime, sandbox_id, ["sh", "-c", "sleep 37 & sleep 38"], timeout=0.5)
    assert result.signal == signal.SIGKILL and result.exit_code == 137, result
    assert time.monotonic() - started < 5
    # The lifetime ends the whole process group, or every timed-out command leaks one.
    eventually(
        lambda: ok(runtime, sandbox_id, "ps -e -o pid=,args="),
        until=lambda ps: "sleep 3" not in ps,
        within=2,
        what="the timed-out command's group ended",
    )


# ------------------------------------------------------------------------- restarts
def test_a_new_runtime_object_adopts_running_sandboxes(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    info = runtime.create(SandboxSpec(sandbox_id, "base"))
    restarted = LocalRuntime(runtime.root)  # what a service restart sees: only the disk
    seen = restarted.status(sandbox_id)
    assert seen.state is SandboxState.RUNNING and seen.init_pid == info.init_pid
    assert sandbox_id in {s.sandbox_id for s in restarted.list()}
    again = restarted.create(SandboxSpec(sandbox_id, "base"))
    assert again.adopted and again.init_pid == info.init_pid
    restarted.pause(sandbox_id)
    assert runtime.status(sandbox_id).state is SandboxState.PAUSED
    restarted.resume(sandbox_id)
    assert ok(restarted, sandbox_id, "echo hi").strip() == "hi"
    assert restarted.kill(sandbox_id) is True
    assert not any(d.exists() for d in cgroup_dirs(runtime, sandbox_id))


def one_listener(runtime: LocalRuntime) -> list[int]:
    """The root's one sandboxd listener. A spare launcher the listener is parking carries
    the listener's command line for the moment between its fork and its renaming itself,
    so a single look can see two on a loaded machine: two that stay are two listeners."""
    return eventually(
        lambda: daemon_pids(runtime.root),
        within=5,
        what="exactly one sandboxd listener for the root",
        until=lambda pids: len(pids) == 1,
    )


def test_sandboxes_survive_a_sandboxd_crash_and_creates_still_work(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    before, after = new_sandbox_id(), new_sandbox_id()
    info = runtime.create(SandboxSpec(before, "base"))
    daemons = one_listener(runtime)
    sigkill_and_reap(daemons[0])

    assert runtime.status(before).state is SandboxState.RUNNING
    state = proc_state(info.init_pid)
    assert state is not None and state[0] != "Z", state
    assert ok(runtime, before, "echo still here").strip() == "still here"

    fresh = runtime.create(SandboxSpec(after, "base"))
    assert fresh.state is SandboxState.RUNNING and not fresh.adopted
    # Spare launchers die with their listener, so that create launched afresh.
    new_daemons = one_listener(runtime)
    assert new_daemons != daemons
    assert ok(runtime, after, "cat /proc/1/comm").strip() == "e2b-init"


def test_a_sandbox_launched_by_a_crashed_sandboxd_keeps_a_reaper(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    # sandboxd is a subreaper because the host's PID 1 cannot be relied on to reap (this
    # one reaps only every ~2 s; some never do). If sandboxd dies, the inits it launched must
    # still have a reaper of the runtime as parent, not the host's PID 1, or every one of
    # them is left a zombie when it is killed.
    sid, other = new_sandbox_id(), new_sandbox_id()
    info = runtime.create(SandboxSpec(sid, "base"))
    start = proc_state(info.init_pid)[1]  # type: ignore[index]
    for pid in daemon_pids(runtime.root):
        sigkill_and_reap(pid)
    runtime.create(SandboxSpec(other, "base"))  # a new daemon serves new creates

    parent = parent_pid(info.init_pid)
    assert parent != 1 and parent in any_daemon_pids(runtime.root), (
        f"init {info.init_pid} is now a child of {parent} {cmdline(parent or 0)!r}"
    )
    assert runtime.kill(sid) is True
    eventually(
        lambda: proc_state(info.init_pid),
        until=lambda state: state is None or state[1] != start,
        within=5,
        what="the init reaped",
    )


def test_a_sandbox_whose_init_died_is_kept_with_its_files_and_what_it_held_is_released(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    info = runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, "sleep 60 >/dev/null 2>&1 &")
    assert sandbox_id in runtime.live_ids()  # its init's pidfd is now kept (InitWatch)
    os.kill(info.init_pid, signal.SIGKILL)  # the kernel then kills the whole pid namespace
    eventually(
        lambda: runtime.status(sandbox_id).state,
        until=lambda s: s is SandboxState.PAUSED,
        within=5,
        what="the crashed sandbox kept as paused",
    )
    assert sandbox_id in runtime.census().kept  # the kept pidfd says it ended; its disk stays
    with pytest.raises(RuntimeConflict):
        run(runtime, sandbox_id, ["true"])

    assert sandbox_id not in runtime.sweep()  # not reaped: its groups go, its files stay
    assert (runtime.root / "sandboxes" / sandbox_id / "disk.img").exists()
    assert not any(d.exists() for d in cgroup_dirs(runtime, sandbox_id))
    assert sandbox_id in {s.sandbox_id for s in runtime.list()}
    assert runtime.kill(sandbox_id) is True  # only a kill deletes it
    assert not (runtime.root / "sandboxes" / sandbox_id).exists()
    assert runtime.kill(sandbox_id) is False


def test_sweep_removes_a_cgroup_without_a_sandbox(runtime: LocalRuntime, sandbox_id: str) -> None:
    # A create that crashed after making the groups and before making the directory.
    runtime.cgroups.create(sandbox_id, cpu_count=1, memory_mb=64, pids_max=64)
    assert all(d.is_dir() for d in cgroup_dirs(runtime, sandbox_id))
    assert sandbox_id in runtime.sweep()
    assert not any(d.exists() for d in cgroup_dirs(runtime, sandbox_id))


def test_sweep_leaves_live_sandboxes_alone(runtime: LocalRuntime, sandbox_id: str) -> None:
    info = runtime.create(SandboxSpec(sandbox_id, "base"))
    runtime.pause(sandbox_id)
    assert sandbox_id not in runtime.sweep()
    assert runtime.status(sandbox_id).state is SandboxState.PAUSED
    assert runtime.status(sandbox_id).init_pid == info.init_pid
    runtime.resume(sandbox_id)
    assert sh(runtime, sandbox_id, "true").exit_code == 0


def test_exec_passes_stdin_output_and_exit_status_through(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    result = run(
        runtime, sandbox_id, ["sh", "-c", "tr a-z A-Z; echo err >&2; exit 7"], stdin=b"hello\n"
    )
    assert result == type(result)(7, b"HELLO\n", b"err\n")
    assert run(runtime, sandbox_id, ["sh", "-c", "kill -9 $$"]).exit_code == 137
    assert run(runtime, sandbox_id, ["no-such-program"]).exit_code == 127
    assert ok(runtime, sandbox_id, "pwd", cwd="/home/user").strip() == "/home/user"


def test_a_host_that_hangs_up_before_its_answer_does_not_jam_the_agent(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    # The agent's answer to a request whose host already hung up fails to write (EPIPE) and
    # frees the connection's slot. That slot must come back clean: once, it kept the
    # "answered" mark, and the next connection accepted into it was never answered.
    runtime.create(SandboxSpec(sandbox_id, "base"))
    path = runtime.layout.sandbox_dir(sandbox_id) / "agent.sock"
    for _ in range(20):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hasty:
            hasty.connect(str(path))
            hasty.sendall(struct.pack(">I", 1) + b"L")  # list: answered at once
        assert ok(runtime, sandbox_id, "echo answered") == "answered\n"
