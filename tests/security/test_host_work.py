"""The host's work on what a guest made is bounded: deep trees, special files, sparse
files, endless output and grandchildren holding pipes cannot crash, stall or grow the
processes that serve sandboxes, nor leave anything behind."""

from __future__ import annotations

import os
import resource
import time
import uuid
from collections.abc import Callable

import pytest

from e2bfacade.runtime.base import (
    GuestFileError,
    LimitExceeded,
    ProcessSpec,
    SandboxNotFound,
    SandboxSpec,
)
from e2bfacade.runtime.guest import run_process
from e2bfacade.runtime.local import HostRuntime, LocalRuntime
from tests.runtime.conftest import destroy_runtime, make_gvisor_runtime, make_runtime
from tests.runtime.helpers import buried, cgroup_file, cgroup_pids, ok, run
from tests.security.drivers import is_gvisor, xfail_on_gvisor
from tests.support.waiting import eventually

# Deeper than the host's descriptor limit and far beyond Python's recursion limit: a walk
# that recursed, or held a descriptor per level, fails on it.
DEPTH = 25_000
# gvisor: its gofer (directfs off) resolves a file by its whole path from the root, so a
# guest's tree ends where a path passes 4 096 bytes (ENAMETOOLONG: "d/" 2 000 levels deep);
# still far beyond Python's recursion limit.
GVISOR_DEPTH = 1_900


def depth_for(runtime: HostRuntime) -> int:
    return GVISOR_DEPTH if is_gvisor(runtime) else DEPTH


def make_deep_tree(runtime: HostRuntime, sandbox_id: str, user: str = "user") -> None:
    script = (
        "import os, socket\n"
        "os.chdir('/home/user')\n"
        f"for i in range({depth_for(runtime)}):\n"
        "    os.mkdir('d'); os.chdir('d')\n"
        "open('leaf', 'w').write('x')\n"
        "os.mkfifo('fifo')\n"
        "socket.socket(socket.AF_UNIX).bind('sock')\n"
        "os.link('leaf', 'hardlink')\n"
        "os.symlink('/etc/shadow', 'link')\n"
    )
    result = run(runtime, sandbox_id, ["python3", "-c", script], user=user, timeout=120)
    assert result.exit_code == 0, result


@pytest.mark.sandboxer
def test_a_deep_tree_of_special_files_is_snapshotted_measured_and_killed_completely(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    # gvisor: below the host's descriptor limit (see GVISOR_DEPTH), still beyond recursion.
    assert DEPTH > resource.getrlimit(resource.RLIMIT_NOFILE)[0] or is_gvisor(runtime)
    runtime.create(SandboxSpec(sandbox_id, "base", memory_mb=256))
    make_deep_tree(runtime, sandbox_id)
    assert runtime.metrics(sandbox_id).disk_used > 0
    snap = f"deep-{uuid.uuid4().hex[:8]}"
    runtime.snapshot(sandbox_id, snap)
    restored = f"r{uuid.uuid4().hex[:12]}"
    try:
        runtime.create(SandboxSpec(restored, snap))
        # Relative to a cd in steps: the full path is longer than PATH_MAX.
        probe = (
            "import os\nos.chdir('/home/user')\n"
            f"for i in range({depth_for(runtime)}):\n    os.chdir('d')\n"
            "import stat\n"
            "print(open('leaf').read(), stat.S_ISFIFO(os.lstat('fifo').st_mode),"
            " stat.S_ISSOCK(os.lstat('sock').st_mode), os.readlink('link'),"
            " os.stat('leaf').st_ino == os.stat('hardlink').st_ino)\n"
        )
        if is_gvisor(runtime):
            # A fifo and a socket made in a gVisor guest live in its kernel only, never on
            # the disk: a snapshot has none (a functional gap of the driver, not a hole).
            for kind, name in (("FIFO", "fifo"), ("SOCK", "sock")):
                made = f"stat.S_IS{kind}(os.lstat('{name}').st_mode)"
                probe = probe.replace(made, f"os.path.lexists('{name}')")
            special = [b"False", b"False"]
        else:
            special = [b"True", b"True"]
        result = run(runtime, restored, ["python3", "-c", probe])
        assert result.stdout.split() == [b"x", *special, b"/etc/shadow", b"True"], result
    finally:
        runtime.kill(restored)
    started = time.monotonic()
    assert runtime.kill(sandbox_id) is True
    assert time.monotonic() - started < 60
    assert not (runtime.root / "sandboxes" / sandbox_id).exists()
    buried(runtime, sandbox_id, timeout=60)
    runtime.delete_image(snap)
    assert not [p for p in (runtime.root / "images").iterdir() if snap in p.name]


@pytest.mark.sandboxer
def test_a_sparse_file_stays_sparse_in_a_snapshot(runtime: HostRuntime, sandbox_id: str) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, "truncate -s 1G /home/user/sparse && echo end >> /home/user/sparse")
    snap = f"sparse-{uuid.uuid4().hex[:8]}"
    info = runtime.snapshot(sandbox_id, snap)
    try:
        assert info.size_bytes < 1 << 20, info  # what it uses on disk, not its length
        copy = runtime.root / "images" / snap / "rootfs" / "home/user/sparse"
        st = os.stat(copy)
        assert st.st_size == (1 << 30) + 4 and st.st_blocks * 512 < 1 << 20
    finally:
        runtime.delete_image(snap)


@pytest.mark.sandboxer
@pytest.mark.parametrize("make", [make_runtime, make_gvisor_runtime], ids=["local", "gvisor"])
def test_a_snapshot_over_the_limit_is_refused_and_leaves_nothing(
    make: Callable[..., LocalRuntime],
) -> None:
    small = make(snapshot_max_bytes=1 << 20)
    small.ensure_base_image()
    sandbox_id = f"t{uuid.uuid4().hex[:12]}"
    try:
        small.create(SandboxSpec(sandbox_id, "base"))
        ok(small, sandbox_id, "head -c 3000000 /dev/urandom > /home/user/big")
        before = sorted(os.listdir(small.root / "images"))
        with pytest.raises(LimitExceeded, match="snapshot limit of 1 MiB"):
            small.snapshot(sandbox_id, "toolarge")
        assert sorted(os.listdir(small.root / "images")) == before
        assert small.status(sandbox_id).state.value == "running"  # thawed again
    finally:
        destroy_runtime(small)


# Local driver only: the cap is the host's (run_process collects at most max_output); on
# gvisor only the transport differs, which the runtime contract's bounded-output test runs
# (tests/runtime/test_contract.py), without pushing a gibibyte through gVisor (39 s).
def test_endless_output_is_capped_and_the_host_does_not_grow(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_process(
        runtime.guest(sandbox_id),
        ProcessSpec(("head", "-c", str(1 << 30), "/dev/zero"), timeout=60),
        max_output=1 << 20,
    )
    assert result.exit_code == 0 and result.truncated and len(result.stdout) == 1 << 20
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kib < 64 * 1024, f"the host process grew by {grown_kib} KiB"


@pytest.mark.sandboxer
def test_a_lifetime_kills_the_whole_tree_and_a_grandchild_never_holds_the_host(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    started = time.monotonic()
    # setsid: out of the command's process group, so its lifetime kill does not reach it.
    result = run_process(
        runtime.guest(sandbox_id),
        ProcessSpec(("sh", "-c", "setsid sleep 300 & echo started; sleep 300"), timeout=1),
    )
    assert result.stdout == b"started\n" and result.signal == 9
    assert time.monotonic() - started < 10
    # The lifetime took the whole tree: the grandchild that left the group is gone too.
    assert "sleep 300" not in ok(runtime, sandbox_id, "ps -e -o args=")


def test_operations_on_a_killed_sandbox_say_it_is_gone(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    runtime.kill(sandbox_id)
    for op in (
        lambda: runtime.guest(sandbox_id).start_process(ProcessSpec(("true",))),
        lambda: runtime.guest(sandbox_id).stat("/"),
        lambda: runtime.metrics(sandbox_id),
    ):
        with pytest.raises(SandboxNotFound):
            op()


def _answers(runtime: HostRuntime, sandbox_id: str) -> bool:
    try:
        return run(runtime, sandbox_id, ["true"], timeout=10).exit_code == 0
    except GuestFileError:  # EAGAIN: the sandbox has no pid left for the command
        return False


def _pids_charged(runtime: HostRuntime, sandbox_id: str) -> int:
    """The pids the sandbox's cgroup counts: zombies too (cgroup.procs lists none).
    gvisor: the guest's tasks, zombies too, as its own kernel counts them (the cgroup
    counts the sentry's threads and stubs, which reaping in the guest does not free)."""
    if is_gvisor(runtime):
        return int(ok(runtime, sandbox_id, "ls -d /proc/[0-9]* | wc -l"))
    return int(cgroup_file(runtime, sandbox_id, "pids", "pids.current").read_text())


@pytest.mark.sandboxer
@xfail_on_gvisor(
    "gvisor: a guest fork bomb takes its own sandbox down: at pids_max (which counts the "
    "sentry's host threads and the ptrace platform's stub processes) gVisor's kernel dies "
    "and the sandbox shows paused; the host and other sandboxes are unharmed"
)
def test_a_fork_bomb_that_outlived_its_commands_lifetime_ends_when_the_sandbox_needs_pids(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base", pids_max=256))
    # The command ends at once, leaving the bomb behind; the bomb's first shell returns at
    # once too, and `timeout` with it (or, if that shell waits for a pid, much later): its
    # orphans fork on, up to the sandbox's pid limit, refilling every pid that frees.
    bomb = "timeout 600 bash -c ':(){ :|:& };:' 2>/dev/null & echo started"
    started = run_process(runtime.guest(sandbox_id), ProcessSpec(("sh", "-c", bomb), timeout=3))
    assert started.stdout == b"started\n"
    eventually(
        lambda: len(cgroup_pids(runtime, sandbox_id)),
        until=lambda n: n > 200,
        within=20,
        what="the bomb past 200 pids",
    )
    time.sleep(3)  # the command's lifetime is over

    # The next command finds no pid, and that ends what outlived its lifetime: the sandbox
    # answers again (it used to refuse every command until it was killed).
    def recovered() -> bool:
        answered = _answers(runtime, sandbox_id)  # a command may slip into a freed pid
        return answered and len(cgroup_pids(runtime, sandbox_id)) < 8

    eventually(recovered, within=60, every=0.5, what="the sandbox answering again")
    assert ok(runtime, sandbox_id, "echo recovered") == "recovered\n"


@pytest.mark.sandboxer
def test_what_a_command_leaves_behind_outlives_its_lifetime_as_on_e2b(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    # `nohup server &` from a command with the SDK's default lifetime: the server lives on
    # (only a command still running when its lifetime ends takes its tree with it).
    daemons = "setsid sleep 300 >/dev/null 2>&1 & sleep 301 >/dev/null 2>&1 & echo started"
    started = ProcessSpec(("sh", "-c", daemons), timeout=2)
    assert run_process(runtime.guest(sandbox_id), started).stdout == b"started\n"
    # The event that its lifetime is over: a later command of the same lifetime, still
    # running, is ended by it.
    later = run_process(runtime.guest(sandbox_id), ProcessSpec(("sleep", "60"), timeout=2))
    assert later.exit_code != 0, later
    assert ok(runtime, sandbox_id, "ps -e -o args=").count("sleep 30") == 2


@pytest.mark.sandboxer
def test_orphans_that_end_while_their_command_runs_are_reaped_at_once(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base", pids_max=256))
    # Each `(true &)` leaves an orphan that ends at once, re-parented to the command's
    # shepherd: unreaped, they would hold the sandbox's pids until the command ended (at the
    # limit, the sandbox would refuse commands with nothing running).
    script = "for i in $(seq 200); do (true &); done 2>/dev/null; echo spawned; sleep 60"
    proc = runtime.guest(sandbox_id).start_process(ProcessSpec(("bash", "-c", script), timeout=90))
    try:
        first = next(iter(proc.output()))
        assert first[1] == b"spawned\n"
        eventually(
            lambda: _pids_charged(runtime, sandbox_id),
            until=lambda n: n < 16,
            within=10,
            every=0.2,
            what="the orphans reaped",
        )
        assert _answers(runtime, sandbox_id)
    finally:
        proc.send_signal(9)
