"""What a guest sees of its machine: its own, never the host's. No host path in its mounts,
a machine's usual umask, and /proc's machine-wide files (boot id, memory, load, uptime,
CPUs) of its own sandbox, as an E2B microVM shows its own."""

from __future__ import annotations

import errno
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from e2bfacade.runtime.base import GuestFileError, SandboxSpec
from e2bfacade.runtime.local import HostRuntime
from tests.runtime.helpers import cgroup_pids, cmdline, ok, sh
from tests.security.drivers import is_gvisor, xfail_on_gvisor
from tests.support.waiting import eventually

pytestmark = pytest.mark.sandboxer


def _umask(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return line.split()[1]
    raise AssertionError(f"no Umask line for {pid}")


def test_the_guests_init_agent_and_commands_have_umask_0022(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    info = runtime.create(SandboxSpec(sandbox_id, "base"))

    def agents() -> list[int]:
        return [p for p in cgroup_pids(runtime, sandbox_id) if cmdline(p)[:1] == [b"e2b-agent"]]

    # gvisor: the init and the agent are tasks of gVisor's kernel, not host processes, and
    # its /proc/<pid>/status has no Umask line; what they hand on is what a command gets.
    if not is_gvisor(runtime):
        agent = eventually(  # named once it runs
            agents, until=lambda a: len(a) == 1, within=5, what="the agent named"
        )
        assert (_umask(info.init_pid), _umask(agent[0])) == ("0022", "0022")
    assert ok(runtime, sandbox_id, "umask").strip() == "0022"
    assert ok(runtime, sandbox_id, "umask", user="user").strip() == "0022"
    # What root makes, user can read (and list), as on any machine.
    ok(runtime, sandbox_id, "echo made-by-root > /tmp/by-root; mkdir /tmp/dir-by-root")
    assert ok(runtime, sandbox_id, "stat -c %a /tmp/by-root /tmp/dir-by-root").split() == [
        "644",
        "755",
    ]
    listing = ok(runtime, sandbox_id, "cat /tmp/by-root; ls -a /tmp/dir-by-root", user="user")
    assert listing.split() == ["made-by-root", ".", ".."]


def test_no_host_path_shows_in_the_guests_mounts_or_df(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    seen = ok(
        runtime,
        sandbox_id,
        "cat /proc/self/mountinfo /proc/mounts /proc/1/mountinfo /proc/self/mountstats; "
        "df -P / /usr /tmp /dev /proc",
    )
    assert str(runtime.root) not in seen
    assert "sandboxes/" not in seen
    root_line = ok(runtime, sandbox_id, "df -P / | tail -1").split()
    assert root_line[-1] == "/"
    # The local driver's root is an overlay; gVisor shows its own file system ("none").
    assert root_line[0] == ("none" if is_gvisor(runtime) else "overlay")


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def test_the_guests_boot_id_is_its_own_and_new_at_every_boot(
    runtime: HostRuntime, sandbox_id: str, new_sandbox_id: Callable[[], str]
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    host = Path(BOOT_ID).read_text()
    first = ok(runtime, sandbox_id, f"cat {BOOT_ID}")
    assert uuid.UUID(first.strip()) and first != host
    assert ok(runtime, sandbox_id, f"cat {BOOT_ID}", user="user") == first
    other = new_sandbox_id()
    runtime.create(SandboxSpec(other, "base"))
    assert ok(runtime, other, f"cat {BOOT_ID}") not in (first, host)
    # The same boot: a freeze and a thaw keep it; guest root cannot change it.
    runtime.pause(sandbox_id)
    runtime.resume(sandbox_id)
    assert ok(runtime, sandbox_id, f"cat {BOOT_ID}") == first
    assert sh(runtime, sandbox_id, f"echo x > {BOOT_ID}").exit_code != 0
    assert sh(runtime, sandbox_id, f"umount {BOOT_ID}").exit_code != 0
    assert ok(runtime, sandbox_id, f"cat {BOOT_ID}") == first
    # A cold boot on the same disk is a new boot.
    runtime.pause(sandbox_id, memory=False)
    runtime.resume(sandbox_id)
    rebooted = ok(runtime, sandbox_id, f"cat {BOOT_ID}")
    assert rebooted not in (first, host) and uuid.UUID(rebooted.strip())


def test_the_file_api_reads_the_guests_proc_and_sys_inside_the_guest_as_the_user(
    runtime: HostRuntime, sandbox_id: str, request: pytest.FixtureRequest
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))

    def read(path: str, user: str = "user") -> bytes:
        return b"".join(runtime.guest(sandbox_id).read_file(path, user=user))

    # The guest's own values (as E2B's SDK test reads boot_id), not the host's.
    assert read(BOOT_ID).decode() == ok(runtime, sandbox_id, f"cat {BOOT_ID}")
    assert read(BOOT_ID) != Path(BOOT_ID).read_bytes()
    # gVisor's sysfs has no /sys/class/net: another of its files, read the same way.
    sys_file = "/sys/devices/system/cpu/online" if is_gvisor(runtime) else "/sys/class/net/lo/mtu"
    assert read(sys_file).decode() == ok(runtime, sandbox_id, f"cat {sys_file}")
    # Read by a guest process of the caller's user: /proc/self is that reader.
    assert "\nUid:\t1000\t1000\t1000\t1000\n" in read("/proc/self/status").decode()
    assert "\nUid:\t0\t0\t0\t0\n" in read("/proc/self/status", user="root").decode()
    ok(runtime, sandbox_id, f"ln -s {BOOT_ID} ~/boot-link", user="user")
    if is_gvisor(runtime):
        # A link into /proc resolves in the root tree on the host, whose /proc is empty:
        # not found (never the host's /proc; a functional gap of the driver, not a hole).
        with pytest.raises(GuestFileError) as missing:
            read("boot-link")
        assert missing.value.errno == errno.ENOENT
    else:
        assert read("boot-link") == read(BOOT_ID)  # a link into /proc, resolved in the guest
    # The guest's answers: its permissions, its errors, a bound on what is read.
    for path, user, code in (
        # the init is not dumpable (gvisor: a hole, the xfail of test_guest_probes.py's
        # test_the_init_cannot_be_read[gvisor-/proc/1/environ-*])
        *([] if is_gvisor(runtime) else [("/proc/1/environ", "root", errno.EACCES)]),
        ("/proc/no-such-file", "user", errno.ENOENT),
        ("/proc/self/root/dev/zero", "user", errno.EFBIG),  # endless: at most 1 MiB is read
    ):
        with pytest.raises(GuestFileError) as caught:
            read(path, user)
        assert caught.value.errno == code, (path, caught.value)
    # Only reads: everything else on the guest's kernel files is still refused by the host
    # (gvisor: the host's tree has an empty read-only file system where gVisor's /proc,
    # /sys, /dev and /run are, so a write there is EROFS, never a file nobody sees).
    gvisor_own = ["/dev/x", "/run/e2b/sandboxd"] if is_gvisor(runtime) else []
    for path in ["/proc/sys/kernel/hostname", *gvisor_own]:
        with pytest.raises(GuestFileError) as refused:
            runtime.guest(sandbox_id).write_file(path, [b"x"], user="root")
        wanted = errno.EROFS if is_gvisor(runtime) else errno.EPERM
        assert refused.value.errno == wanted, (path, refused.value)


@xfail_on_gvisor(
    "gvisor hole (information): the guest's /proc/meminfo and free show the host's total "
    "memory (runsc's --total-memory defaults to the host's), not its memory_mb"
)
def test_the_guest_sees_its_own_memory_limit_uptime_and_load_not_the_hosts(
    runtime: HostRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base", memory_mb=256))
    meminfo = ok(runtime, sandbox_id, "cat /proc/meminfo", user="user")
    assert meminfo.splitlines()[0].split() == ["MemTotal:", str(256 * 1024), "kB"]
    assert ok(runtime, sandbox_id, "free -m | awk '/^Mem:/ {print $2}'") == "256\n"
    host_uptime = float(Path("/proc/uptime").read_text().split()[0])
    uptime = float(ok(runtime, sandbox_id, "cut -d' ' -f1 /proc/uptime"))
    assert uptime < 120 and uptime < host_uptime - 1  # since the sandbox's boot, not the host's
    # The sandbox's own load: its one process running, not the host's hundreds.
    assert (
        ok(runtime, sandbox_id, "cut -d' ' -f4 /proc/loadavg").split("/")[1].strip()
        != (Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    )
    # Through the file API too (read in the guest).
    assert (
        b"".join(runtime.guest(sandbox_id).read_file("/proc/meminfo")).decode().split("\n")[0]
        == (meminfo.splitlines()[0])
    )
