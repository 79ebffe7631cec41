"""A sandbox's files outlive its processes: a filesystem-only pause ends them and keeps the
disk; a sandbox whose processes die under it (its init killed, every process of the runtime
killed, a host reboot) is kept the same way, paused with a reason; a resume cold-boots it
on the same disk, id range, host name and access token. Nothing but a kill deletes it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator

import pytest

from e2bfacade.runtime.base import (
    CRASH_REASON,
    PauseMode,
    ProcessSpec,
    RuntimeBusy,
    RuntimeConflict,
    SandboxSpec,
    SandboxState,
)
from e2bfacade.runtime.local import LocalRuntime
from e2bfacade.runtime.local.storage.disks import MOUNT
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.runtime.helpers import cgroup_dirs, ok, sh
from tests.support.runtime_support import power_cut
from tests.support.waiting import eventually


def boot_id(runtime: LocalRuntime, sandbox_id: str) -> str:
    return ok(runtime, sandbox_id, "cat /proc/sys/kernel/random/boot_id").strip()


def test_a_filesystem_pause_ends_the_processes_keeps_the_files_and_a_resume_cold_boots(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    spec = SandboxSpec(sandbox_id, "base", hostname="keeper", envd_access_token="tok-1")
    first = runtime.create(spec)
    ok(runtime, sandbox_id, "echo kept > /home/user/marker; sleep 600 >/dev/null 2>&1 &")

    runtime.pause(sandbox_id, memory=False)

    info = runtime.status(sandbox_id)
    assert (info.state, info.pause_mode, info.pause_reason) == (
        SandboxState.PAUSED,
        PauseMode.FILESYSTEM,
        None,
    )
    assert not any(d.exists() for d in cgroup_dirs(runtime, sandbox_id))  # memory freed
    eventually(
        lambda: not os.path.exists(f"/proc/{first.init_pid}"), within=5, what="the init gone"
    )
    with pytest.raises(RuntimeConflict):
        runtime.pause(sandbox_id, memory=False)
    with pytest.raises(RuntimeConflict):
        runtime.guest(sandbox_id).start_process(ProcessSpec(("true",)))
    assert sandbox_id in runtime.census().kept
    assert sandbox_id not in runtime.sweep()  # kept, not reaped

    runtime.resume(sandbox_id)

    again = runtime.status(sandbox_id)
    assert again.state is SandboxState.RUNNING and again.pause_mode is None
    assert again.init_pid != first.init_pid
    assert again.envd_access_token == "tok-1"
    assert ok(runtime, sandbox_id, "cat /home/user/marker; hostname") == "kept\nkeeper\n"
    # A cold boot: the processes of before are gone.
    assert "sleep 600" not in ok(runtime, sandbox_id, "ps -eo args")
    assert sandbox_id not in runtime.census().kept


def test_a_sandbox_whose_init_died_is_kept_paused_with_a_reason_and_boots_again(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    info = runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, "echo survived > /home/user/marker")
    os.kill(info.init_pid, signal.SIGKILL)  # the kernel then kills the whole pid namespace

    eventually(
        lambda: runtime.status(sandbox_id).state,
        until=lambda s: s is SandboxState.PAUSED,
        within=5,
        what="the crashed sandbox kept as paused",
    )
    paused = runtime.status(sandbox_id)
    assert paused.pause_mode is PauseMode.FILESYSTEM and paused.pause_reason == CRASH_REASON
    assert sandbox_id in runtime.live_ids() and sandbox_id in runtime.census().kept
    # The sweep releases what its processes held and keeps its files.
    assert sandbox_id not in runtime.sweep()
    assert not any(d.exists() for d in cgroup_dirs(runtime, sandbox_id))
    assert runtime.status(sandbox_id).pause_reason == CRASH_REASON

    runtime.resume(sandbox_id)
    assert ok(runtime, sandbox_id, "cat /home/user/marker") == "survived\n"


def test_resume_without_memory_cold_boots_a_frozen_sandbox(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    info = runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, "echo x > /tmp/in-memory-fs-but-on-disk; sleep 600 >/dev/null 2>&1 &")
    runtime.pause(sandbox_id)
    assert runtime.status(sandbox_id).pause_mode is PauseMode.FULL
    runtime.resume(sandbox_id, memory=False)
    after = runtime.status(sandbox_id)
    assert after.state is SandboxState.RUNNING and after.init_pid != info.init_pid
    assert "sleep 600" not in ok(runtime, sandbox_id, "ps -eo args")


def test_a_cold_boot_that_fails_leaves_the_sandbox_paused_with_its_files(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, "echo precious > /home/user/marker")
    runtime.pause(sandbox_id, memory=False)
    # The guest's root gone from its disk: the init cannot build its file system.
    upper = runtime.root / "sandboxes" / sandbox_id / MOUNT / "upper"
    work = runtime.root / "sandboxes" / sandbox_id / MOUNT / "work"
    hidden = work.with_name("work.hidden")
    work.rename(hidden)
    try:
        with pytest.raises(RuntimeBusy, match="did not boot"):
            runtime.resume(sandbox_id)
        info = runtime.status(sandbox_id)
        assert (info.state, info.pause_mode) == (SandboxState.PAUSED, PauseMode.FILESYSTEM)
        assert (upper / "home/user/marker").read_text() == "precious\n"
    finally:
        hidden.rename(work)
    runtime.resume(sandbox_id)
    assert ok(runtime, sandbox_id, "cat /home/user/marker") == "precious\n"


def test_a_power_cut_keeps_every_sandbox_running_and_paused_and_each_boots_again(
    make_root_runtime: Callable[[], LocalRuntime],
) -> None:
    runtime = make_root_runtime()
    ids = {"run": "pcrun", "frozen": "pcfrozen", "fs": "pcfs"}
    for name, sid in ids.items():
        runtime.create(SandboxSpec(sid, "base", hostname=f"h-{name}", envd_access_token=name))
        ok(runtime, sid, f"echo {name} > /home/user/marker; sync")
        assert len(boot_id(runtime, sid)) == 36
    runtime.pause(ids["frozen"])
    runtime.pause(ids["fs"], memory=False)

    power_cut(runtime.root)
    for sid in ids.values():  # as after a reboot: no disk is mounted, no init runs
        assert not os.path.ismount(runtime.root / "sandboxes" / sid / MOUNT)
    restarted = LocalRuntime(runtime.root)  # the service started again on the same root

    census = restarted.census()
    assert set(ids.values()) <= census.kept and set(ids.values()) <= census.live
    for name, sid in ids.items():
        info = restarted.status(sid)
        assert (info.state, info.pause_mode) == (SandboxState.PAUSED, PauseMode.FILESYSTEM)
        assert info.pause_reason == (None if name == "fs" else CRASH_REASON)
    assert restarted.sweep() == []  # nothing is deleted
    for name, sid in ids.items():
        restarted.resume(sid)
        assert restarted.status(sid).envd_access_token == name
        assert ok(restarted, sid, "cat /home/user/marker; hostname") == f"{name}\nh-{name}\n"
        assert sh(restarted, sid, "touch /home/user/writable").exit_code == 0
    for sid in ids.values():
        assert restarted.kill(sid) is True


@pytest.fixture
def make_root_runtime() -> Iterator[Callable[[], LocalRuntime]]:
    made: list[LocalRuntime] = []

    def make() -> LocalRuntime:
        rt = make_runtime(prefix="e2bd-", spares=0)
        rt.ensure_base_image()
        made.append(rt)
        return rt

    yield make
    for rt in made:
        destroy_runtime(LocalRuntime(rt.root, spares=0))
