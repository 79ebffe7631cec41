"""What a guest can see and touch of the host: processes, files, network, privileges."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import SandboxRuntimeError, SandboxSpec
from e2bfacade.runtime.local import LocalRuntime
from tests.runtime.helpers import ok, run, sh


@pytest.fixture
def running(runtime: LocalRuntime, sandbox_id: str) -> str:
    runtime.create(SandboxSpec(sandbox_id, "base", memory_mb=128, pids_max=128))
    return sandbox_id


def host_marker(directory: str) -> Iterator[Path]:
    path = Path(directory) / f"e2bt-marker-{uuid.uuid4().hex[:8]}"
    path.write_text("host-only secret\n")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture
def root_marker() -> Iterator[Path]:
    yield from host_marker("/root")


@pytest.fixture
def home_marker() -> Iterator[Path]:
    yield from host_marker("/home")


@pytest.fixture
def var_marker() -> Iterator[Path]:
    yield from host_marker("/var/tmp")


def tree_digest(path: Path) -> str:
    """Names, types, modes, sizes and contents of everything under ``path``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            h.update(f"{os.path.relpath(p, path)} {st.st_mode} {st.st_size}\n".encode())
            if os.path.isfile(p) and not os.path.islink(p):
                h.update(Path(p).read_bytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------ processes
def test_guest_pid_1_is_the_sandbox_init(runtime: LocalRuntime, running: str) -> None:
    assert ok(runtime, running, "cat /proc/1/comm").strip() == "e2b-init"


def test_guest_sees_none_of_the_host_processes(runtime: LocalRuntime, running: str) -> None:
    listed = ok(runtime, running, "ls /proc").split()
    pids = sorted(int(x) for x in listed if x.isdigit())
    # init, the shell running ls and ls itself: a handful of small pids, nothing else.
    assert pids and len(pids) <= 5 and max(pids) < 50, pids
    assert os.getpid() not in pids
    commands = ok(runtime, running, "ps -e -o pid=,comm=")
    assert "pytest" not in commands and "python" not in commands, commands
    assert "sandboxd" not in commands, commands
    assert ok(runtime, running, f"test -e /proc/{os.getpid()} || echo absent").strip() == "absent"


def test_guest_sees_its_own_cgroup_as_the_root(runtime: LocalRuntime, running: str) -> None:
    # Every hierarchy line reads "<n>:<controllers>:/": no host cgroup path leaks in.
    lines = ok(runtime, running, "cat /proc/self/cgroup").split()
    assert lines and all(line.rsplit(":", 1)[1] == "/" for line in lines), lines
    assert running not in " ".join(lines)


# ----------------------------------------------------------------------------- host files
def test_guest_cannot_read_host_root(
    runtime: LocalRuntime, running: str, root_marker: Path
) -> None:
    assert sh(runtime, running, f"cat /root/{root_marker.name}").exit_code != 0
    assert ok(runtime, running, "ls -A /root").split() == []


def test_guest_shadow_is_the_skeleton_not_the_host_file(
    runtime: LocalRuntime, running: str
) -> None:
    inside = ok(runtime, running, "cat /etc/shadow")
    host = Path("/etc/shadow").read_text()
    assert inside != host
    assert inside.splitlines() == ["root:*:19000:0:99999:7:::", "user:*:19000:0:99999:7:::"]
    host_hashes = [line.split(":")[1] for line in host.splitlines() if line.count(":") >= 2]
    assert not any(h.startswith("$") and h in inside for h in host_hashes)


def test_guest_cannot_see_host_home(runtime: LocalRuntime, running: str, home_marker: Path) -> None:
    assert sh(runtime, running, f"test -e /home/{home_marker.name}").exit_code != 0
    assert ok(runtime, running, "ls -A /home").split() == ["user"]


def test_guest_cannot_see_host_var(runtime: LocalRuntime, running: str, var_marker: Path) -> None:
    assert sh(runtime, running, f"test -e /var/tmp/{var_marker.name}").exit_code != 0
    assert ok(runtime, running, "ls -A /var/tmp").split() == []
    assert ok(runtime, running, "ls -A /var/lib /var/log /var/cache").split() == [
        "/var/cache:",
        "/var/lib:",
        "/var/log:",
    ]


# ------------------------------------------------------------------------ template safety
def test_guest_writes_never_reach_the_template(
    runtime: LocalRuntime, new_sandbox_id: object
) -> None:
    make_id = new_sandbox_id
    template = runtime.root / "images" / "base" / "rootfs"
    before = tree_digest(template)
    a, b = make_id(), make_id()  # type: ignore[operator]
    runtime.create(SandboxSpec(a, "base"))
    ok(
        runtime,
        a,
        "echo leak > /etc/newfile && echo changed > /etc/hostname && "
        "echo leak > /home/user/x && mkdir -p /opt/new && rm /etc/hosts",
    )
    ok(runtime, a, "echo leak > /home/user/y", user="user")
    assert tree_digest(template) == before
    runtime.create(SandboxSpec(b, "base"))
    seen = ok(
        runtime,
        b,
        "ls /etc/newfile /home/user/x /home/user/y /opt/new 2>&1; cat /etc/hostname /etc/hosts",
    )
    assert "leak" not in seen and "changed" not in seen
    assert "e2b" in seen and "localhost" in seen


def test_guest_usr_is_read_only(runtime: LocalRuntime, running: str) -> None:
    result = sh(runtime, running, "touch /usr/bin/e2bt-x")
    assert result.exit_code != 0
    assert b"Read-only" in result.stderr
    assert not Path("/usr/bin/e2bt-x").exists()
    assert sh(runtime, running, "rm /usr/bin/env").exit_code != 0
    assert Path("/usr/bin/env").exists()


def test_host_users_cannot_run_guest_setuid_files_from_the_sandbox_root(
    runtime: LocalRuntime, running: str
) -> None:
    # Guest root may make a setuid-root copy of a host program in its own file system.
    # That file lands in the sandbox's upper dir on the host; a host user other than root
    # must not be able to reach it, or it is a root shell for every local account.
    ok(runtime, running, "cp /usr/bin/id /tmp/suid-id && chmod 4755 /tmp/suid-id")
    planted = runtime.root / "sandboxes" / running / "disk" / "upper" / "tmp" / "suid-id"
    assert planted.exists()
    try:
        proc = subprocess.run(
            [str(planted), "-u"], user=65534, group=65534, capture_output=True, text=True
        )
    except PermissionError:
        return  # the sandbox root is closed to other users: fine
    assert proc.stdout.strip() != "0", "an unprivileged host user became root"


# -------------------------------------------------------------------------------- network
@pytest.fixture
def host_tcp_server() -> Iterator[int]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[object] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = server.getsockname()[1]
    # The server works from the host, so a failure inside is the sandbox's doing.
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    yield port
    server.close()


def test_guest_cannot_reach_a_host_loopback_server(
    runtime: LocalRuntime, running: str, host_tcp_server: int
) -> None:
    script = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {host_tcp_server}), timeout=2)\n"
        "except OSError as e:\n"
        "    print('refused', e); sys.exit(3)\n"
        "print('connected')\n"
    )
    result = run(runtime, running, ["python3", "-c", script])
    assert result.exit_code == 3, result
    assert b"connected" not in result.stdout


def test_guest_has_only_the_loopback_interface(runtime: LocalRuntime, running: str) -> None:
    assert ok(runtime, running, "ls /sys/class/net").split() == ["lo"]
    devices = ok(runtime, running, "tail -n +3 /proc/net/dev | cut -d: -f1").split()
    assert devices == ["lo"]


# ----------------------------------------------------------------------------- privileges
def test_guest_root_cannot_mount(runtime: LocalRuntime, running: str) -> None:
    result = sh(runtime, running, "mount -t tmpfs x /mnt")
    assert result.exit_code != 0
    assert ok(runtime, running, "grep -c ' /mnt ' /proc/self/mounts || true").strip() == "0"


def test_guest_root_lacks_cap_sys_admin(runtime: LocalRuntime, running: str) -> None:
    status = ok(runtime, running, "grep -E '^Cap(Eff|Bnd):' /proc/self/status")
    cap_sys_admin = 1 << 21
    for line in status.splitlines():
        assert not int(line.split()[1], 16) & cap_sys_admin, line


def test_guest_proc_sys_is_read_only(runtime: LocalRuntime, running: str) -> None:
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    result = sh(runtime, running, "echo '|/tmp/x' > /proc/sys/kernel/core_pattern")
    assert result.exit_code != 0
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before
    assert sh(runtime, running, "echo 1 > /proc/sysrq-trigger").exit_code != 0


def test_exec_as_uid_1000_runs_as_that_user(runtime: LocalRuntime, running: str) -> None:
    assert ok(runtime, running, "id -u; id -g", user="user").split() == ["1000", "1000"]
    assert ok(runtime, running, "stat -c %u:%g /home/user").strip() == "1000:1000"
    ok(runtime, running, "echo mine > /home/user/f && cat /home/user/f", user="user")
    assert sh(runtime, running, "touch /etc/x", user="user").exit_code != 0
    assert sh(runtime, running, "ls /root", user="user").exit_code != 0


# ----------------------------------------------------------------------- launch arguments
def test_a_hostname_cannot_smuggle_extra_launch_options(
    runtime: LocalRuntime, sandbox_id: str, root_marker: Path
) -> None:
    # The launch request is NUL-separated key=value items: a NUL in the hostname must not
    # become a bind of the host's /root into the guest.
    spec = SandboxSpec(sandbox_id, "base", hostname="h\0bind=/root:/mnt")
    try:
        runtime.create(spec)
    except SandboxRuntimeError:
        return  # refused: fine
    listing = ok(runtime, sandbox_id, "ls -A /mnt")
    assert root_marker.name not in listing, "the host's /root is mounted in the guest"


# --------------------------------------------------------------- the files of the data plane
def test_file_operations_never_follow_a_guest_symlink_onto_the_host(
    runtime: LocalRuntime, running: str, host_scratch: Path
) -> None:
    # Links that name the host directory: resolved on the host, they would land in it.
    ok(
        runtime,
        running,
        f"cd /home/user && ln -s {host_scratch} abs && ln -s ../..{host_scratch} rel",
    )
    (host_scratch / "host-file").write_text("host only\n")
    for link in ("abs", "rel"):  # the target does not exist in the guest: nothing happens
        for op in (
            lambda link=link: runtime.guest(running).make_dir(f"{link}/made"),
            lambda link=link: runtime.guest(running).write_file(f"{link}/written", [b"guest\n"]),
            lambda link=link: b"".join(runtime.guest(running).read_file(f"{link}/host-file")),
        ):
            with pytest.raises(SandboxRuntimeError):
                op()
    ok(runtime, running, f"mkdir -p {host_scratch} && chown user {host_scratch}")
    for link in ("abs", "rel"):  # now it does, in the guest: that is where the links lead
        runtime.guest(running).make_dir(f"{link}/made-{link}")
        runtime.guest(running).write_file(f"{link}/written-{link}", [b"guest\n"])
        with pytest.raises(SandboxRuntimeError):
            b"".join(runtime.guest(running).read_file(f"{link}/host-file"))
    assert sorted(p.name for p in host_scratch.iterdir()) == ["host-file"]
    listing = ok(runtime, running, f"ls {host_scratch}").split()
    assert listing == ["made-abs", "made-rel", "written-abs", "written-rel"]


def test_file_operations_refuse_the_guests_kernel_interfaces(
    runtime: LocalRuntime, running: str
) -> None:
    for op in (
        lambda: runtime.guest(running).write_file("/proc/sys/kernel/hostname", [b"x"], user="root"),
        lambda: runtime.guest(running).remove("/proc", user="root"),
        lambda: b"".join(runtime.guest(running).read_file("/proc/1/environ", user="root")),
        lambda: runtime.guest(running).remove("/", user="root"),
    ):
        with pytest.raises(SandboxRuntimeError):
            op()
    assert ok(runtime, running, "cat /proc/1/stat | cut -d' ' -f1") == "1\n"
    listed = {e.name for e in runtime.guest(running).list_dir("/", user="root", depth=2)}
    assert "proc" in listed and "1" not in listed  # /proc is listed, not walked


def test_a_reused_init_pid_never_opens_the_hosts_root(runtime: LocalRuntime, running: str) -> None:
    from e2bfacade.runtime.local.guest.syscalls import SandboxGone, open_guest_root

    info = runtime.status(running)
    with pytest.raises(SandboxGone):  # the right pid, the wrong process start time
        open_guest_root(info.init_pid, 12345)
