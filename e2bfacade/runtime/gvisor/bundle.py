"""A gVisor sandbox's root and OCI bundle.

The root is built on the host, in the sandbox's directory, as one tree that runsc's gofer
serves and the runtime's file operations open alike (``sandboxes/<id>/rootfs``):

- an overlay of the image's layers (read-only) under the sandbox's disk (``disk/upper``),
  with the local driver's options, so layers, disks and snapshots are the local driver's
  formats; files keep the guest's own ids on disk (gVisor has no id mapping to undo: the
  sentry shows the gofer's ids as they are);
- the image's host binds (the ``base`` template's ``/usr``) read-only, and the sandbox's
  volumes read-write, mounted on it at their guest paths.

The bundle (``sandboxes/<id>/bundle/config.json``) runs the runtime's helper as the guest's
PID 1 (``sandboxd guest PORT``: the guest agent on TCP and the orphans' reaper) from a
read-only directory mounted at ``/run/e2b``, in the sandbox's network namespace, with
Docker's default capabilities less ``MKNOD`` (as a local sandbox), ``/proc``, ``/sys``,
``/dev`` and ``/run`` of gVisor's own, and ``/tmp`` on the disk.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2bfacade.runtime.base import CreateRefused
from e2bfacade.runtime.local.atomic import write_json
from e2bfacade.runtime.local.storage import disks
from e2bfacade.runtime.local.storage.volumes import HostMount

_libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MNT_DETACH = 2

# Docker's default set minus MKNOD, as the local driver's init keeps (local/launcher/c/init.c).
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE", "CAP_SETFCAP",
]  # fmt: skip
HELPER_DIR = "/run/e2b"

# The guest's filter, on top of gVisor's own kernel, against one escalation gVisor allows:
# any guest user may make a user namespace and, with that namespace's CAP_NET_RAW, open
# packet or raw sockets on the sandbox's link, and read the host's traffic to the agent
# (the commands root runs). So: no user namespace through clone or unshare (as Docker's
# default profile), and no packet socket nor raw IP socket for anyone (clone3, whose flags a
# filter cannot read, stays allowed: this runsc answers a filtered call with EPERM, never
# ENOSYS, and libc falls back to clone only on ENOSYS, so refusing it would refuse every
# thread). Raw sockets of other families stay: netlink's are how shadow-utils asks for the
# audit interface (socket(AF_NETLINK, SOCK_RAW, NETLINK_AUDIT)), which gVisor has not and
# answers EPROTONOSUPPORT, the one answer on which useradd and usermod go on without audit
# (an EPERM from a filter makes them abort: "Cannot open audit interface").
CLONE_NEWUSER = 0x10000000
AF_INET, AF_INET6, AF_PACKET, SOCK_RAW, SOCK_TYPE_MASK = 2, 10, 17, 3, 0xF
EPERM = 1


def _arg(index: int, value: int, mask: int = 0xFFFFFFFF) -> dict[str, Any]:
    return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def _refuse(name: str, *args: dict[str, Any]) -> dict[str, Any]:
    """A rule refusing ``name`` (EPERM) when every one of ``args`` holds."""
    return {"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM, "args": list(args)}


SECCOMP = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "architectures": ["SCMP_ARCH_X86_64"],
    "syscalls": [
        _refuse("clone", _arg(0, CLONE_NEWUSER, CLONE_NEWUSER)),
        _refuse("unshare", _arg(0, CLONE_NEWUSER, CLONE_NEWUSER)),
        _refuse("socket", _arg(0, AF_PACKET)),
        _refuse("socket", _arg(0, AF_INET), _arg(1, SOCK_RAW, SOCK_TYPE_MASK)),
        _refuse("socket", _arg(0, AF_INET6), _arg(1, SOCK_RAW, SOCK_TYPE_MASK)),
    ],
}


def _mount(source: str, target: Path, fstype: str | None, flags: int, data: str | None) -> None:
    rc = _libc.mount(
        source.encode(),
        os.fsencode(target),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise CreateRefused(f"mount {source} on {target}: {os.strerror(err)}")


def _inside(root: Path, guest_path: str) -> Path:
    """``guest_path`` under ``root``, made as a directory if missing, every component
    resolved inside the root (a guest-made symlink never leads a mount out of it)."""
    current = root
    for part in Path(guest_path).relative_to("/").parts:
        if part in ("", ".", ".."):
            raise CreateRefused(f"mount point {guest_path!r} is not a plain path")
        current = current / part
        if current.is_symlink():
            raise CreateRefused(f"mount point {guest_path!r} crosses a symbolic link")
        if not current.exists():
            current.mkdir(mode=0o755)
        elif not current.is_dir():
            raise CreateRefused(f"mount point {guest_path!r} is not a directory")
    return current


def mount_root(
    sandbox_dir: Path,
    layers: Sequence[Path],
    binds: Sequence[str],
    volumes: Sequence[HostMount],
) -> Path:
    """Mount the sandbox's root tree (the module's header); the disk must be mounted. A
    mounted one is taken down first. Returns the root."""
    root = sandbox_dir / "rootfs"
    unmount_root(sandbox_dir)
    root.mkdir(mode=0o755, exist_ok=True)
    disk = sandbox_dir / disks.MOUNT
    opts = (
        "lowerdir="
        + ":".join(str(p) for p in layers)
        + f",upperdir={disk / 'upper'},workdir={disk / 'work'}"
        + ",userxattr,redirect_dir=nofollow,index=off,metacopy=off"
    )
    _mount("overlay", root, "overlay", MS_NODEV | MS_NOSUID, opts)
    try:
        for name in ("proc", "sys", "dev", "run", "tmp"):
            _inside(root, f"/{name}")
        os.chmod(root / "tmp", 0o1777)
        # gVisor's own inside: on the host tree, empty and read-only, so that a file operation
        # made from the host there fails (EROFS) instead of landing unseen under them.
        # (runsc's gofer makes the helper's mount point, /run/e2b, in this tree: made first.)
        for name in ("proc", "sys", "dev", "run"):
            _mount("tmpfs", root / name, "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=755")
            if name == "run":
                (root / name / HELPER_DIR.rsplit("/", 1)[1]).mkdir(mode=0o755)
            flags = MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
            _mount("none", root / name, None, flags, None)
        for host_dir in binds:
            target = _inside(root, host_dir)
            _mount(host_dir, target, None, MS_BIND | MS_REC, None)
            _mount(
                "none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None
            )
        for volume in volumes:
            target = _inside(root, volume.target)
            _mount(str(volume.source), target, None, MS_BIND, None)
            _mount("none", target, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, None)
    except BaseException:
        unmount_root(sandbox_dir)
        raise
    return root


def unmount_root(sandbox_dir: Path) -> None:
    """Take the root tree down, submounts and all (lazily: a sandbox still running from a
    copy of it keeps its own)."""
    root = sandbox_dir / "rootfs"
    while os.path.ismount(root):
        if _libc.umount2(os.fsencode(root), MNT_DETACH) != 0:
            break


def helper_dir(sandbox_dir: Path, helper: Path) -> Path:
    """A root-owned directory holding only a copy of the helper, mounted read-only at
    ``/run/e2b`` in the guest."""
    d = sandbox_dir / "helper"
    d.mkdir(mode=0o755, exist_ok=True)
    target = d / "sandboxd"
    if not target.exists():
        tmp = d / ".sandboxd.new"
        shutil.copyfile(helper, tmp)
        os.chmod(tmp, 0o555)
        os.replace(tmp, target)
    return d


def write(
    sandbox_dir: Path,
    *,
    hostname: str,
    netns: Path,
    helper: Path,
    agent_port: int,
) -> Path:
    """Write the sandbox's OCI bundle; its directory."""
    bundle = sandbox_dir / "bundle"
    bundle.mkdir(mode=0o700, exist_ok=True)
    tmpfs = ["nosuid", "nodev", "mode=755", "size=65536k"]
    config: dict[str, Any] = {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": [f"{HELPER_DIR}/sandboxd", "guest", str(agent_port)],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {k: CAPABILITIES for k in ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}],
            "noNewPrivileges": False,
        },
        "root": {"path": str(sandbox_dir / "rootfs"), "readonly": False},
        "hostname": hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
            },
            {
                "destination": "/dev/shm",
                "type": "tmpfs",
                "source": "shm",
                "options": ["nosuid", "nodev", "mode=1777", "size=65536k"],
            },
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            },
            {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": tmpfs},
            {
                "destination": HELPER_DIR,
                "type": "bind",
                "source": str(helper),
                "options": ["rbind", "ro"],
            },
            # Named, so that runsc leaves it on the disk: an empty /tmp it would cover with
            # a tmpfs of its own, whose files the host's file operations never see.
            {
                "destination": "/tmp",
                "type": "bind",
                "source": str(sandbox_dir / "rootfs" / "tmp"),
                "options": ["rbind", "rw"],
            },
        ],  # fmt: skip
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "network", "path": str(netns)},
            ],
            "seccomp": SECCOMP,
        },
    }
    write_json(bundle / "config.json", config)
    return bundle
