"""Tearing a runtime root down (``python manage.py teardown_root``).

A root's sandboxes outlive the service's processes on purpose (a restarted service adopts
them), and so does everything the runtime put into the host for them: policy-routing rules
and routing tables, an nftables table, the disks' mounts and loop devices, cgroups, the
launcher daemon, and the root's claim in the host's registry of roots (roots.py), which
keeps another root from taking its range. Nothing else removes them once the service is
gone for good: this does, for one root, in this order —

1. refuse while the root has live sandboxes (running or paused), unless told to kill them;
2. end the spare launchers, the pooled disks and the warm pool;
3. kill the running sandboxes (their files go, as a kill's do); a *paused* sandbox's disk is
   its user's data: its processes end, and its disk image is moved to
   ``kept/<sandbox id>/disk.img`` (with ``sandbox.json`` saying what it was) before the rest
   of it is removed — never deleted;
4. the network: the table, the rules, the routing tables, the claim, and the guard of the
   sandboxes' addresses against the host's other accounts (net/accounts.py);
5. the launcher daemon, the root's cgroup parents, the claim of its block of host ids, and
   whatever mount under the root or loop device backed by a file under it is still there
   (the volumes' host mounts among them).

What it leaves: files. ``images/`` (templates and snapshots), ``kept/``, ``volumes/`` (each
volume's image: its users' data) and the root directory itself; delete them once they are
no one's. Run it with the service of that root
stopped: a create that races it may leave a sandbox behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from e2bfacade.runtime import registry
from e2bfacade.runtime.base import RuntimeUnavailable, SandboxInfo, SandboxState
from e2bfacade.runtime.local import lxcfs
from e2bfacade.runtime.local.cgroups import Cgroups, CgroupsV1, CgroupsV2
from e2bfacade.runtime.local.driver import HostRuntime
from e2bfacade.runtime.local.net import accounts, network, roots
from e2bfacade.runtime.local.net.network import digest_of
from e2bfacade.runtime.local.storage import disks, trees

KEPT = "kept"
LOOP_CLR_FD = 0x4C01
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


class LiveSandboxes(Exception):
    """The root has live sandboxes and killing them was not asked for."""

    def __init__(self, sandboxes: list[SandboxInfo]) -> None:
        self.sandboxes = sandboxes
        listed = ", ".join(f"{s.sandbox_id} ({s.state})" for s in sandboxes)
        super().__init__(f"the root has {len(sandboxes)} live sandbox(es): {listed}")


@dataclass
class Report:
    """What a teardown did, and what it could not undo (``left``: should be empty)."""

    killed: list[str] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def teardown_root(root: Path, *, kill: bool) -> Report:
    """Remove what the runtime root ``root`` holds of the host (see the module's doc).
    Raises :class:`LiveSandboxes` when it has live sandboxes and ``kill`` is false; then
    nothing has been touched. Safe to run again (a second run finds nothing to do)."""
    report = Report()
    digest = digest_of(root)
    registered = claim = roots.find(digest)
    parents: list[Path] = []
    if (root / "sandboxes").is_dir():
        # Adopts the root as a restarted service would, but takes no host ids: a root whose
        # block another root holds (roots.py) can be torn down too.
        runtime = _adopt(root)
        made = {s.sandbox_id: s for s in runtime.list()}
        live = [s for s in made.values() if s.state is not SandboxState.DEAD]
        if live and not kill:
            raise LiveSandboxes(live)
        runtime.discard_spares()
        for sandbox_id in sorted(runtime.layout.sandbox_ids() | runtime.cgroups.list_ids()):
            info = made.get(sandbox_id)
            if info is not None and info.state is not SandboxState.RUNNING:
                # Paused, or dead with its files (its init gone: a reboot): user data.
                kept = _keep_disk(runtime, sandbox_id)
                if kept is not None:
                    report.kept.append(kept)
            runtime.kill(sandbox_id)
            if info is not None and info.state is SandboxState.RUNNING:
                report.killed.append(sandbox_id)
        _finish_burials(root)
        if runtime.network is not None:
            runtime.network.teardown()
            claim = None  # done, with what the root had registered (or would have had)
        # Given up: no later process of this root sets its network up again by itself.
        network.save_config(runtime.layout, None)
        _stop_daemons(root)
        lxcfs.stop(root)
        parents = _cgroup_parents(runtime.cgroups)
        _remove_groups(parents)
        roots.release_ids(root)  # unless a sandbox is left, or a service still runs
    if claim is not None:  # no networking configured any more: what the registry says
        network.uninstall(claim)
        roots.release(digest)
    accounts.remove(digest)  # the guard of its sandboxes' addresses, networking or not
    _unmount_under(root)
    _detach_loops_under(root)
    report.left = leftovers(root, parents, registered)
    return report


def _adopt(root: Path) -> HostRuntime:
    """The root's runtime, by the driver that made it (registry.drivers_for_root: gVisor's
    for a root where runsc keeps its state, so that its sandboxes end through runsc), or,
    where that one cannot run any more, the fallback's (their processes still end with
    their groups)."""
    *made, fallback = registry.drivers_for_root(root)
    for name in made:
        with contextlib.suppress(RuntimeUnavailable):
            return registry.host_driver_class(name)(root, claim_ids=False)
    return registry.host_driver_class(fallback)(root, claim_ids=False)


def _keep_disk(runtime: HostRuntime, sandbox_id: str) -> Path | None:
    """End the sandbox's processes, if any, and move its disk image to ``kept/``."""
    d = runtime.layout.sandbox_dir(sandbox_id)
    with runtime.layout.locked("sandbox", sandbox_id):
        record = runtime.layout.read_state(sandbox_id)
        state = record.to_json() if record is not None else {}
        image = d / disks.IMAGE
        if not image.exists():
            return None
        runtime.cgroups.kill_all(sandbox_id)
        runtime.cgroups.wait_empty(sandbox_id)
        kept = runtime.root / KEPT / sandbox_id
        kept.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(kept.parent, 0o700)
        # The same file system: a rename. The mount still holds the image open, and its
        # last writes (the unmount's) land in the kept file.
        os.rename(image, kept / disks.IMAGE)
        if (d / "checkpoint").is_dir():  # a gVisor sandbox paused with its memory
            os.rename(d / "checkpoint", kept / "checkpoint")
        about = {
            "sandbox_id": sandbox_id,
            "image_id": state.get("image_id"),
            "created_at": state.get("created_at"),
            "disk_mb": state.get("disk_mb"),
            "id_base": state.get("id_base"),
            "kept_at": time.time(),
            "why": "paused when its runtime root was torn down; its files are under upper/ "
            "of this ext4 image, owned by host ids "
            + ("id_base + guest id" if runtime.disk_id_base(1) else "equal to guest ids")
            + (
                " (checkpoint/: its memory, as runsc checkpoint wrote it)"
                if record and record.parked is not None and record.parked.memory
                else ""
            ),
        }
        (kept / "sandbox.json").write_text(json.dumps(about, indent=1) + "\n")
        return kept / disks.IMAGE


def _finish_burials(root: Path) -> None:
    """Wait for the kills' background removals, then do any that are left ourselves: this
    process exits soon, and its daemon threads with it."""
    for thread in threading.enumerate():
        if thread.name == "e2bfacade-bury":
            thread.join(timeout=60)
    for tomb in (root / "sandboxes").glob(".*.deleting"):
        with contextlib.suppress(OSError):
            disks.detach(tomb)
            trees.remove_tree(tomb)


def _daemon_pids(root: Path) -> list[int]:
    """The root's launcher daemons: a binary under ``bin/`` or a socket under ``run/`` on
    their command line."""
    bin_prefix = os.fsencode(root / "bin") + b"/"
    sock_prefix = os.fsencode(root / "run" / "sandboxd-")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].startswith(bin_prefix) or any(sock_prefix in arg for arg in argv):
            found.append(int(entry))
    return found


def _stop_daemons(root: Path) -> None:
    for pid in _daemon_pids(root):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            # Through the pidfd: the process checked above, even if its pid were reused.
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)


def _cgroup_parents(cgroups: Cgroups) -> list[Path]:
    """The root's own cgroup directories (one per hierarchy on v1)."""
    if isinstance(cgroups, CgroupsV1):
        return list(cgroups.roots.values())
    if isinstance(cgroups, CgroupsV2):
        return [cgroups.root]
    return []


def _remove_groups(parents: list[Path]) -> None:
    for parent in parents:
        if not parent.is_dir():
            continue
        for group in sorted(p for p in parent.iterdir() if p.is_dir()):
            with contextlib.suppress(OSError):
                group.rmdir()  # an empty group a crash left (one with tasks stays, reported)
        with contextlib.suppress(OSError):
            parent.rmdir()


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` in this mount namespace, deepest first."""
    prefix = str(root.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def loops_under(root: Path) -> list[str]:
    """Loop devices whose backing file is (or was, if deleted) below ``root``."""
    prefix = str(root.resolve()) + "/"
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().strip().startswith(prefix):
                found.append(f"/dev/{backing.parent.parent.name}")
    return sorted(found)


def _unmount_under(root: Path) -> None:
    for point in mounts_under(root):
        # Lazily, as the runtime's own unmounts: a process still inside lets go later.
        _libc.umount2(os.fsencode(point), MNT_DETACH)


def _detach_loops_under(root: Path) -> None:
    for device in loops_under(root):
        with contextlib.suppress(OSError):
            fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, LOOP_CLR_FD)
            finally:
                os.close(fd)


def leftovers(root: Path, cgroup_parents: list[Path], claim: roots.RootClaim | None) -> list[str]:
    """What of ``root`` the host still holds: mounts, loop devices, launchers, cgroups, its
    claim (``claim``: what it had registered) and what the kernel holds of it."""
    left = [f"mount {p}" for p in mounts_under(root)]
    # A lazily unmounted disk lets go of its loop device once its last user has, and a
    # killed launcher leaves the process table once reaped: give the kernel a moment.
    deadline = time.monotonic() + 5
    while (loops_under(root) or _daemon_pids(root)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left += [f"loop device {d}" for d in loops_under(root)]
    left += [f"launcher process {pid}" for pid in _daemon_pids(root)]
    left += [f"cgroup {p}" for p in cgroup_parents if p.exists()]
    digest = digest_of(root)
    if roots.find(digest) is not None:
        left.append(f"its claim {roots.REGISTRY / digest}.json")
    table = f"e2bfacade_{digest[:8]}"
    if network.table_exists(table) or (claim is not None and network.installed(claim)):
        left.append(f"network rules or the nftables table {table}")
    if network.table_exists(accounts.table_of(digest)):
        left.append(f"the nftables table {accounts.table_of(digest)}")
    return left
