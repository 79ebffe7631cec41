"""Guest identities are nobody on the host: a user namespace per sandbox with an id range
of its own, so guest root (and anything a setuid program lifts to it) is an unprivileged
host uid, and no two live sandboxes share an id."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from e2bfacade.runtime.base import ProcessSpec, SandboxSpec, UnknownUser
from e2bfacade.runtime.local import HostRuntime
from tests.runtime.helpers import ok, run, sh
from tests.security.drivers import is_gvisor, only_on

# The gvisor driver's host side: the sentry (runsc-sandbox) runs in the host's user namespace
# as uid 0 with CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_SETUID... (runsc
# with directfs, its default): an escape from gVisor's kernel is host root, where an escape
# from a local sandbox is an unprivileged host uid.


def host_uid_and_caps(pid: int) -> tuple[int, int]:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(status["Uid"].split()[1]), int(status["CapEff"].strip(), 16)


def id_base(runtime: HostRuntime, sandbox_id: str) -> int:
    state = runtime.layout.read_state(sandbox_id)
    assert state is not None
    return state.id_base


@pytest.mark.sandboxer
def test_guest_root_and_user_are_unprivileged_host_ids(
    runtime: HostRuntime, sandbox_id: str, request: pytest.FixtureRequest
) -> None:
    info = runtime.create(SandboxSpec(sandbox_id, "base"))
    base = id_base(runtime, sandbox_id)
    assert base >= 1 << 20
    if is_gvisor(runtime):
        # No guest id is a host id: the guest's processes are gVisor's tasks, and its files
        # keep the guest's own ids on the disk (the disk's id base is 0).
        base = 0
    else:
        assert os.stat(f"/proc/{info.init_pid}").st_uid == base  # the init, as the host sees it
    assert ok(runtime, sandbox_id, "id -u; touch /root/by-root").split() == ["0"]
    ok(runtime, sandbox_id, "touch /home/user/by-user", user="user")
    upper = runtime.root / "sandboxes" / sandbox_id / "disk" / "upper"
    assert os.stat(upper / "root/by-root").st_uid == base
    assert os.stat(upper / "home/user/by-user").st_uid == base + 1000
    # Inside, the same files are guest root's and guest user's, and /usr is root's.
    listing = ok(runtime, sandbox_id, "stat -c '%u %n' /root/by-root /home/user/by-user /usr/bin")
    assert listing.split() == ["0", "/root/by-root", "1000", "/home/user/by-user", "0", "/usr/bin"]
    if is_gvisor(runtime):
        # What holds the guest on the host (the sentry) must hold no host privilege either.
        uid, caps = host_uid_and_caps(info.init_pid)
        assert uid != 0, f"the sentry is host uid {uid} with CapEff {caps:#x}"


def test_two_live_sandboxes_never_share_an_id_and_a_kill_frees_the_range(
    runtime: HostRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    a, b = new_sandbox_id(), new_sandbox_id()
    runtime.create(SandboxSpec(a, "base"))
    runtime.create(SandboxSpec(b, "base"))
    base_a, base_b = id_base(runtime, a), id_base(runtime, b)
    assert abs(base_a - base_b) >= 65536
    held = {p.read_text() for p in (runtime.root / "ids").iterdir() if p.name.isdigit()}
    assert {a, b} <= held
    runtime.kill(a)
    assert a not in {p.read_text() for p in (runtime.root / "ids").iterdir() if p.name.isdigit()}
    assert not (runtime.root / "ids" / f"s-{a}").exists()


@pytest.mark.sandboxer
def test_usr_stays_read_only_whatever_guest_root_tries(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    marker = f"/usr/e2bt-planted-{sandbox_id}"
    result = sh(
        runtime,
        sandbox_id,
        f"mount -o remount,rw /usr; mount -o remount,rw,bind /usr; echo x > {marker}; "
        f"chmod u+s /usr/bin/env; chown 0 /usr/bin/env",
    )
    if is_gvisor(runtime):
        # gVisor answers chmod and chown on the read-only /usr with success and changes
        # nothing, in the guest's view as on the host's: what counts is what /usr holds.
        host = os.stat("/usr/bin/env")
        seen = ok(runtime, sandbox_id, "stat -c '%a %u %g' /usr/bin/env").split()
        assert seen == [f"{stat.S_IMODE(host.st_mode):o}", str(host.st_uid), str(host.st_gid)]
        assert "Read-only file system" in result.stderr.decode()
    else:
        assert result.exit_code != 0
    assert not os.path.exists(marker)
    assert not os.stat("/usr/bin/env").st_mode & 0o4000


@pytest.mark.skipif(shutil.which("sudo") is None, reason="sudo is not installed on this host")
def test_sudo_lifts_user_to_guest_root_and_no_further(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    only_on(
        runtime,
        "local",
        "gVisor (runsc 20240729) implements no setuid exec and sets no_new_privs on every "
        "task (google/gvisor#5299): sudo cannot lift guest user at all, nothing to bound",
    )
    runtime.create(SandboxSpec(sandbox_id, "base"))
    result = run(
        runtime, sandbox_id, ["sudo", "-n", "sh", "-c", "id -u; touch /root/by-sudo"], user="user"
    )
    assert result.exit_code == 0 and result.stdout == b"0\n", result
    upper = runtime.root / "sandboxes" / sandbox_id / "disk" / "upper"
    assert os.stat(upper / "root/by-sudo").st_uid == id_base(runtime, sandbox_id)
    # What guest root cannot do, sudo cannot either.
    result = run(runtime, sandbox_id, ["sudo", "-n", "unshare", "-U", "true"], user="user")
    assert result.exit_code != 0


@pytest.mark.sandboxer
def test_per_uid_kernel_limits_are_per_sandbox(
    runtime: HostRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    a, b = new_sandbox_id(), new_sandbox_id()
    runtime.create(SandboxSpec(a, "base"))
    runtime.create(SandboxSpec(b, "base"))
    limit = int(open("/proc/sys/fs/inotify/max_user_instances").read())
    hog = (
        "import ctypes, sys, time\n"
        "libc = ctypes.CDLL(None)\n"
        f"fds = [libc.inotify_init() for _ in range({limit} + 8)]\n"
        "print(sum(fd >= 0 for fd in fds), flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = runtime.guest(a).start_process(
        ProcessSpec(("python3", "-c", hog), user="user", timeout=30)
    )
    try:
        stream, data = next(iter(proc.output()))
        # Sandbox A's user took every instance it may have. gvisor: its inotify instances are
        # the sentry's own, charged to no host uid, and bounded by the sandbox's memory only.
        assert int(data) <= limit or is_gvisor(runtime)
        probe = "import ctypes; print(ctypes.CDLL(None).inotify_init() >= 0)"
        assert ok(runtime, b, f'python3 -c "{probe}"', user="user").strip() == "True"
    finally:
        proc.send_signal(9)
        proc.close()


def test_the_state_directory_is_root_only(runtime: HostRuntime) -> None:
    # No other host account may read a layer or hold a lock file to stall the runtime.
    for path in (
        runtime.root,
        *(runtime.root / d for d in ("images", "sandboxes", "locks", "ids")),
    ):
        st = os.stat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700), path


def _host_uids_in(tree: os.PathLike[str] | str) -> set[int]:
    return {os.lstat(os.path.join(d, n)).st_uid for d, _, ns in os.walk(tree) for n in ns}


@pytest.mark.sandboxer
@pytest.mark.parametrize("kind", ["wraps to host root", "past the range", "gid past the range"])
def test_a_passwd_account_outside_the_id_range_is_refused_not_taken_by_a_host_thread(
    runtime: HostRuntime, sandbox_id: str, kind: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    base = id_base(runtime, sandbox_id)
    # The guest reads its own base in /proc/self/uid_map and writes the account it likes.
    if is_gvisor(runtime):
        # No id map: the guest's ids are the ones the host's file operations use (base 0).
        base = 0
        assert ok(runtime, sandbox_id, "cat /proc/self/uid_map").split() == ["0", "0", "4294967295"]
    else:
        uid_map = ok(runtime, sandbox_id, "cat /proc/self/uid_map").split()
        assert uid_map == ["0", str(base), "65536"]
    uid, gid = {
        "wraps to host root": ((1 << 32) - base, 0),
        "past the range": (65536, 0),
        "gid past the range": (1000, 70000),
    }[kind]
    ok(runtime, sandbox_id, f"echo 'evil:x:{uid}:{gid}::/tmp:/bin/sh' >> /etc/passwd")
    upper = runtime.root / "sandboxes" / sandbox_id / "disk" / "upper"
    guest = runtime.guest(sandbox_id)
    for attempt in (
        lambda: guest.write_file("/tmp/evil-wrote", [b"x"], user="evil"),
        lambda: guest.make_dir("/tmp/evil-dir", user="evil"),
        lambda: guest.stat("/root", user="evil"),
        lambda: guest.start_process(ProcessSpec(("true",), user="evil")),
    ):
        with pytest.raises(UnknownUser, match="outside the sandbox"):
            attempt()
    assert not (upper / "tmp/evil-wrote").exists() and not (upper / "tmp/evil-dir").exists()
    # Every file of the sandbox's is still one of its own ids.
    assert {u for u in _host_uids_in(upper) if not base <= u < base + 65536} == set()
    # An account in range still works.
    guest.write_file("/tmp/by-user", [b"x"], user="user")
    assert os.stat(upper / "tmp/by-user").st_uid == base + 1000
