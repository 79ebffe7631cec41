"""What the gvisor driver adds to the contract (tests/runtime/test_contract.py runs that on
it): a pause that keeps memory on disk and frees it, across a power cut and a new runtime;
memory snapshots whose sandboxes continue the source's processes, each a copy with its own
identity; and the reach of its agent (the host's root only). Skipped where runsc is not
installed (scripts/setup.sh installs it)."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import (
    FsChange,
    GuestFileError,
    PauseMode,
    ProcessSpec,
    RuntimeConflict,
    SandboxSpec,
    SandboxState,
)
from e2bfacade.runtime.gvisor.driver import GvisorRuntime
from e2bfacade.runtime.gvisor.link import AGENT_PORT
from e2bfacade.runtime.gvisor.sandboxer import CHECKPOINT
from e2bfacade.runtime.local.state import proc_starttime
from tests.runtime.conftest import destroy_runtime, make_gvisor_runtime
from tests.runtime.helpers import sh
from tests.support.runtime_support import power_cut
from tests.support.waiting import eventually

# A process whose state lives only in its memory: a token drawn at start and a counter,
# written to a file every 50 ms, with its pid. A restarted process would draw a new token.
KEEPER = (
    "import os, secrets, time\n"
    "token, n = secrets.token_hex(8), 0\n"
    "heap = os.urandom(8 << 20)\n"
    "while True:\n"
    "    n += 1\n"
    "    open('/tmp/state.new', 'w').write(f'{token} {n} {os.getpid()} {hash(heap)}')\n"
    "    os.replace('/tmp/state.new', '/tmp/state')\n"
    "    time.sleep(0.05)\n"
)


@pytest.fixture
def rt(gvisor_runtime: GvisorRuntime) -> GvisorRuntime:
    return gvisor_runtime


@pytest.fixture
def sandbox(rt: GvisorRuntime) -> Iterator[str]:
    sid = f"g{uuid.uuid4().hex[:12]}"
    rt.create(SandboxSpec(sid, "base"))
    yield sid
    rt.kill(sid)


def start_keeper(rt: GvisorRuntime, sid: str) -> tuple[str, int, str, str]:
    """Start KEEPER in the sandbox; its first state (token, counter, pid, heap hash)."""
    rt.guest(sid).start_process(ProcessSpec(("python3", "-c", KEEPER))).close()
    out = eventually(
        lambda: sh(rt, sid, "cat /tmp/state 2>/dev/null").stdout.decode().split(),
        until=lambda words: len(words) == 4,
        within=20,
        every=0.1,
        what="the process's first state",
    )
    return out[0], int(out[1]), out[2], out[3]


def state_of(rt: GvisorRuntime, sid: str) -> tuple[str, int, str, str]:
    """The keeper's state once its loop has beaten again (it runs on)."""

    def read() -> tuple[str, int, str, str]:
        token, n, pid, heap = sh(rt, sid, "cat /tmp/state").stdout.decode().split()
        return token, int(n), pid, heap

    first = read()[1]
    return eventually(read, until=lambda s: s[1] > first, within=10, what="the keeper's loop")


def test_a_full_pause_checkpoints_to_disk_frees_the_processes_and_resume_continues_them(
    rt: GvisorRuntime, sandbox: str
) -> None:
    token, n, pid, heap = start_keeper(rt, sandbox)
    init = rt.status(sandbox).init_pid
    rt.pause(sandbox)
    info = rt.status(sandbox)
    assert (info.state, info.pause_mode) == (SandboxState.PAUSED, PauseMode.FULL)
    d = rt.layout.sandbox_dir(sandbox)
    assert sum(f.stat().st_size for f in (d / CHECKPOINT).iterdir()) > 8 << 20  # the heap
    assert proc_starttime(init) is None  # no process of it is left on the host
    assert not rt.cgroups.exists(sandbox)
    with pytest.raises(RuntimeConflict):
        rt.pause(sandbox)  # paused already
    with pytest.raises(RuntimeConflict):
        rt.guest(sandbox)
    rt.resume(sandbox)
    again = state_of(rt, sandbox)
    assert again[0] == token and again[2] == pid and again[3] == heap
    assert again[1] > n
    assert not (d / CHECKPOINT).exists()  # the image goes once restored


def test_pause_and_resume_cycles_repeat(rt: GvisorRuntime, sandbox: str) -> None:
    token, n, pid, _ = start_keeper(rt, sandbox)
    for _ in range(3):
        rt.pause(sandbox)
        rt.resume(sandbox)
        now = state_of(rt, sandbox)
        assert (now[0], now[2]) == (token, pid) and now[1] > n
        n = now[1]


def test_a_memory_pause_survives_a_power_cut_and_a_new_runtime(
    rt: GvisorRuntime, sandbox: str
) -> None:
    token, n, pid, heap = start_keeper(rt, sandbox)
    running = f"g{uuid.uuid4().hex[:12]}"
    rt.create(SandboxSpec(running, "base"))
    sh(rt, running, "echo kept > /home/user/file; sync")
    rt.pause(sandbox)
    power_cut(rt.root)  # every process of the root killed at once, no disk mounted
    after = GvisorRuntime(rt.root)
    info = after.status(sandbox)
    assert (info.state, info.pause_mode) == (SandboxState.PAUSED, PauseMode.FULL)
    # The one that was running lost its processes, never its files.
    lost = after.status(running)
    assert (lost.state, lost.pause_mode) == (SandboxState.PAUSED, PauseMode.FILESYSTEM)
    after.resume(sandbox)
    again = state_of(after, sandbox)
    assert (again[0], again[2], again[3]) == (token, pid, heap) and again[1] > n
    after.resume(running)
    assert sh(after, running, "cat /home/user/file").stdout == b"kept\n"
    after.kill(running)


def test_a_filesystem_pause_drops_memory_and_a_resume_cold_boots_on_the_files(
    rt: GvisorRuntime, sandbox: str
) -> None:
    token, *_ = start_keeper(rt, sandbox)
    sh(rt, sandbox, "echo mine > /home/user/file")
    rt.pause(sandbox, memory=False)
    info = rt.status(sandbox)
    assert (info.state, info.pause_mode) == (SandboxState.PAUSED, PauseMode.FILESYSTEM)
    rt.resume(sandbox)
    assert sh(rt, sandbox, "cat /home/user/file").stdout == b"mine\n"
    assert sh(rt, sandbox, "ps -eo comm | grep -cx python3 || true").stdout == b"0\n"  # fresh


def test_a_memory_snapshot_starts_copies_that_continue_its_processes_each_its_own(
    rt: GvisorRuntime, sandbox: str
) -> None:
    token, n, pid, heap = start_keeper(rt, sandbox)
    sh(rt, sandbox, "echo source > /home/user/file")
    image = f"m{uuid.uuid4().hex[:12]}"
    forks = [f"f{uuid.uuid4().hex[:12]}" for _ in range(2)]
    rt.snapshot(sandbox, image, memory=True)
    try:
        assert rt.status(sandbox).state is SandboxState.RUNNING  # the source goes on
        for index, fork in enumerate(forks):
            rt.create(SandboxSpec(fork, image, hostname=f"copy{index}"))
        addresses = set()
        for index, fork in enumerate(forks):
            copied = state_of(rt, fork)
            assert (copied[0], copied[2], copied[3]) == (token, pid, heap)
            assert sh(rt, fork, "hostname").stdout == f"copy{index}\n".encode()
            assert sh(rt, fork, "cat /home/user/file").stdout == b"source\n"
            sh(rt, fork, f"echo {fork} > /home/user/file")
            addresses.add(rt.sandboxer.link_of(fork).guest_ip)
        assert len(addresses) == 2 and rt.sandboxer.link_of(sandbox).guest_ip not in addresses
        assert sh(rt, sandbox, "cat /home/user/file").stdout == b"source\n"
        source = state_of(rt, sandbox)
        assert (source[0], source[2]) == (token, pid)
    finally:
        for fork in forks:
            rt.kill(fork)
        rt.delete_image(image)


def test_a_pause_resets_the_connections_into_the_sandbox_and_succeeds(
    rt: GvisorRuntime, sandbox: str
) -> None:
    server = (
        "import socket, time\n"
        "s = socket.socket(); s.bind(('0.0.0.0', 8000)); s.listen()\n"
        "while True:\n c, _ = s.accept(); c.sendall(b'hi'); time.sleep(3600)"
    )
    rt.guest(sandbox).start_process(ProcessSpec(("python3", "-c", server))).close()
    conn = eventually(
        lambda: rt.guest(sandbox).connect_port(8000),
        within=10,
        what="the guest's server listening",
        ignoring=(GuestFileError,),
    )
    assert conn.recv(2) == b"hi"
    rt.pause(sandbox)  # would fail with the connection open (gVisor cannot save it)
    conn.settimeout(5)
    with pytest.raises(OSError):
        if conn.recv(1) == b"":
            raise ConnectionResetError
    conn.close()
    rt.resume(sandbox)


def test_only_the_hosts_root_reaches_a_sandboxs_agent(rt: GvisorRuntime, sandbox: str) -> None:
    address = rt.sandboxer.link_of(sandbox).guest_ip
    socket.create_connection((address, AGENT_PORT), timeout=5).close()  # root: yes
    probe = f"import socket; socket.create_connection(({address!r}, {AGENT_PORT}), timeout=5)"
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0 and "refused" in done.stderr.lower()
    with pytest.raises(Exception, match="not a TCP port"):
        rt.guest(sandbox).connect_port(AGENT_PORT)  # nor does port forwarding lead to it
    # Nor the guest's own users, from its loopback or its address: a list request ('L')
    # gets no answer, the agent hangs up at once.
    ask = (
        "import socket, sys\n"
        "for host in ('127.0.0.1', sys.argv[1]):\n"
        f"    s = socket.create_connection((host, {AGENT_PORT}), timeout=5)\n"
        "    s.sendall(b'\\0\\0\\0\\1L')\n"
        "    try:\n"
        "        print(host, s.recv(64))\n"
        "    except ConnectionResetError:\n"
        "        print(host, b'')\n"
    )
    for user in ("user", "root"):
        out = sh(rt, sandbox, f'python3 -c "{ask}" {address}', user=user).stdout.decode()
        assert out.splitlines() == ["127.0.0.1 b''", f"{address} b''"], (user, out)


def test_the_runtime_root_can_be_torn_down_with_a_paused_sandbox() -> None:
    other = make_gvisor_runtime("e2bgt-")
    try:
        other.ensure_base_image()
        sid = f"g{uuid.uuid4().hex[:12]}"
        other.create(SandboxSpec(sid, "base"))
        other.pause(sid)
        assert other.kill(sid)
        assert not Path(other.layout.sandbox_dir(sid)).exists()
        assert not any(os.scandir(other.root / "runsc"))
    finally:
        destroy_runtime(other)


def test_a_watcher_sees_the_hosts_file_operations_as_the_guests_own(
    rt: GvisorRuntime, sandbox: str
) -> None:
    guest = rt.guest(sandbox)
    guest.make_dir("wd")
    kept = guest.create_watcher("wd", recursive=True)
    guest.write_file("wd/new.txt", [b"one"])  # from the host: gVisor's inotify never sees it
    guest.write_file("wd/new.txt", [b"two"])
    guest.make_dir("wd/sub/deeper")
    sh(rt, sandbox, "echo guest > /home/user/wd/sub/inside.txt")  # the guest's own: inotify
    guest.move("wd/new.txt", "wd/sub/moved.txt")
    guest.remove("wd/sub/moved.txt")
    wanted = [
        (FsChange.CREATE, "new.txt"),
        (FsChange.WRITE, "new.txt"),
        (FsChange.CREATE, "sub"),
        (FsChange.CREATE, "sub/deeper"),
        (FsChange.RENAME, "new.txt"),
        (FsChange.CREATE, "sub/moved.txt"),
        (FsChange.REMOVE, "sub/moved.txt"),
        (FsChange.CREATE, "sub/inside.txt"),
    ]
    events: list[tuple[FsChange, str]] = []  # each call hands over the changes since the last

    def collected() -> list[tuple[FsChange, str]]:
        events.extend((e.change, e.name) for e in guest.watcher_events(kept).events)
        return events

    eventually(
        collected,
        until=lambda seen: all(change in seen for change in wanted),
        within=5,
        what="every change reported",
    )
    guest.remove_watcher(kept)
