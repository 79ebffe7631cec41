"""Facts about the host a local runtime root lives on: its id, and what it can give
sandboxes."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from pathlib import Path

from e2bfacade.runtime.base import Capacity, RuntimeUnavailable


def check_supported() -> None:
    """RuntimeUnavailable unless this process and kernel can run the host runtime."""
    if os.geteuid() != 0:
        raise RuntimeUnavailable(
            "the local sandbox runtime needs root (it creates namespaces, overlay mounts "
            "and cgroups); run the service as root or choose another SANDBOX_RUNTIME"
        )
    for ns in ("pid", "mnt", "uts", "ipc", "net"):
        if not os.path.exists(f"/proc/self/ns/{ns}"):
            raise RuntimeUnavailable(f"this kernel has no {ns} namespaces")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise RuntimeUnavailable("this kernel has no overlayfs (modprobe overlay)")


def host_id(root: Path) -> str:
    """This root's host id: the machine's name and the root's path when the root was first
    used (kept in ``root/host-id``, so a renamed machine keeps its sandboxes)."""
    path = root / "host-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    tmp = root / f".host-id.{os.getpid()}.tmp"
    tmp.write_text(f"{socket.gethostname()}:{root}\n")
    with contextlib.suppress(FileExistsError):
        os.link(tmp, path)  # the first process to name it wins; the others read its name
    tmp.unlink()
    return path.read_text().strip()


def capacity(root: Path, reserve_mb: int | None) -> Capacity:
    """This host's CPUs, and the memory and pids left for sandboxes after the host's own
    reserve (default: a fifth of memory, at least 1 GiB; half the kernel's thread limit)."""
    meminfo = Path("/proc/meminfo").read_text().split("\n")
    total_mb = next(int(line.split()[1]) >> 10 for line in meminfo if line.startswith("MemTotal:"))
    if reserve_mb is None:
        reserve_mb = max(1024, total_mb // 5)
    threads = int(Path("/proc/sys/kernel/threads-max").read_text())
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    disk = shutil.disk_usage(root)
    return Capacity(
        cpus=os.cpu_count() or 1,
        memory_mb=max(total_mb - reserve_mb, 64),
        pids=max(min(threads, pid_max) // 2, 64),
        disk_mb=disk.total >> 20,
    )
