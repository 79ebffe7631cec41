"""Host-side probes shared by the runtime tests: they look at the host directly (procfs,
cgroupfs, the file system), never through the runtime under test, so a runtime that lies
about its own state is caught."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from e2bfacade.runtime.base import ProcessResult, ProcessSpec, Runtime
from e2bfacade.runtime.guest import run_process
from e2bfacade.runtime.local import HostRuntime, build
from tests.support.waiting import eventually

V1_CONTROLLERS = ("freezer", "memory", "pids", "cpu", "cpuacct")
MiB = 1024 * 1024


def run(
    rt: Runtime,
    sandbox_id: str,
    argv: list[str],
    *,
    user: str = "root",
    cwd: str = "/",
    stdin: bytes = b"",
    timeout: float = 30,
) -> ProcessResult:
    """Run ``argv`` in the sandbox and wait for it (as root in / unless told otherwise)."""
    spec = ProcessSpec(tuple(argv), user=user, cwd=cwd, timeout=timeout)
    return run_process(rt.guest(sandbox_id), spec, stdin=stdin)


def sh(rt: Runtime, sandbox_id: str, script: str, **kwargs: Any) -> ProcessResult:
    return run(rt, sandbox_id, ["sh", "-c", script], **kwargs)


def ok(rt: Runtime, sandbox_id: str, script: str, **kwargs: Any) -> str:
    """Run ``script`` in the sandbox, assert it succeeded and return its stdout."""
    result = sh(rt, sandbox_id, script, **kwargs)
    assert result.exit_code == 0, (script, result)
    return result.stdout.decode()


def cgroup_dirs(rt: HostRuntime, sandbox_id: str) -> list[Path]:
    """Where the sandbox's cgroups live on the host, derived from the cgroupfs layout rather
    than from the driver's own bookkeeping."""
    parent = rt.cgroups.parent_name
    if rt.cgroups.version == 2:
        return [Path("/sys/fs/cgroup") / parent / sandbox_id]
    base = Path("/sys/fs/cgroup")
    return [base / c / parent / sandbox_id for c in V1_CONTROLLERS if (base / c).is_dir()]


def cgroup_file(rt: HostRuntime, sandbox_id: str, controller: str, name: str) -> Path:
    parent = rt.cgroups.parent_name
    if rt.cgroups.version == 2:
        return Path("/sys/fs/cgroup") / parent / sandbox_id / name
    return Path("/sys/fs/cgroup") / controller / parent / sandbox_id / name


def cgroup_pids(rt: HostRuntime, sandbox_id: str) -> list[int]:
    procs = cgroup_file(rt, sandbox_id, "freezer", "cgroup.procs")
    try:
        return [int(x) for x in procs.read_text().split()]
    except FileNotFoundError:
        return []


def proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of a host process, or None when no such pid exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def host_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []


def kill_and_wait(pids: list[int], timeout: float = 30.0) -> None:
    """SIGKILL ``pids`` and wait for each to end (its pidfd turns readable): the event, not
    a guess at how long the kernel takes on a busy machine."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    try:
        for fd in fds:
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        for fd in fds:
            os.close(fd)


def gone_or_reused(pid: int, start: int | None) -> bool:
    """True when ``pid`` no longer names the process that started at ``start`` — not even
    as a zombie."""
    state = proc_state(pid)
    return state is None or (start is not None and state[1] != start)


def mounts_mentioning(path: Path) -> list[str]:
    """Every mountinfo line, of any process on the host, that mentions ``path``."""
    needle = str(path)
    hits = []
    for pid in ["self", *map(str, host_pids())]:
        try:
            text = Path(f"/proc/{pid}/mountinfo").read_text()
        except OSError:
            continue
        hits += [f"{pid}: {line}" for line in text.splitlines() if needle in line]
    return hits


def parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def daemon_pids(root: Path) -> list[int]:
    """The sandboxd listener(s) serving ``root``, found by the socket path on their command
    line (argv: BINARY daemon SOCKET). A request handler is a fork of the listener with the
    same command line for the moment it lives: a match whose parent also matches is one."""
    sock = str(build.socket_path(root)).encode()
    matches = [p for p in host_pids() if cmdline(p)[1:3] == [b"daemon", sock]]
    return [p for p in matches if parent_pid(p) not in matches]


def any_daemon_pids(root: Path) -> list[int]:
    """Every helper process serving ``root``, whatever source hash it was built from and
    whatever it calls itself: any process whose command line names a socket under it."""
    prefix = str(root / "run" / "sandboxd-").encode()
    return [p for p in host_pids() if any(prefix in arg for arg in cmdline(p))]


def init_and_agent(pids: list[int], init_pid: int) -> bool:
    """Whether ``pids`` (a sandbox's cgroup) are exactly its init and the init's guest agent
    (e2bfacade/runtime/local/launcher/c/agent_conn.c), as right after a create."""
    others = [p for p in pids if p != init_pid]
    if init_pid not in pids or len(others) != 1 or parent_pid(others[0]) != init_pid:
        return False

    # The init reports ready once it has forked the agent; the agent names itself a moment
    # later (until then it is a copy of the init, "e2b-init"). A process gone reads as None.
    def comm() -> str | None:
        try:
            return Path(f"/proc/{others[0]}/comm").read_text().strip()
        except OSError:
            return None

    named = eventually(
        comm, within=5, what="the guest agent named", until=lambda c: c in ("e2b-agent", None)
    )
    return named == "e2b-agent"


def buried(rt: HostRuntime, sandbox_id: str = "", timeout: float = 10) -> None:
    """Wait until a killed sandbox's directory is gone (it goes in the background, a moment
    after kill returns: the tomb ``.<id>.<random>.deleting``); without an id, every one."""

    def tombs() -> list[str]:
        names = os.listdir(rt.root / "sandboxes")
        return [n for n in names if n.endswith(".deleting") and sandbox_id in n]

    eventually(tombs, within=timeout, what="the sandbox directory buried", until=lambda t: not t)


def sigkill_and_reap(pid: int) -> None:
    """SIGKILL a process this test run started (directly or through the runtime) and reap
    it if it is our child, so no zombie of ours outlives the test."""
    kill_and_wait([pid], timeout=2)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def compile_static(source: str, out: Path) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(
        ["gcc", "-static", "-O2", "-o", str(out), str(src)], check=True, capture_output=True
    )
    return out


def loop_backings() -> list[str]:
    """Every loop device's backing file on this host, read from sysfs (a device other
    tests' roots detach between the listing and the read is gone: skipped)."""
    out = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(FileNotFoundError):
            out.append(backing.read_text().strip())
    return out
