"""The host's system calls on a sandbox, through ctypes where Python has no wrapper:
``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` against the guest's root, ``fstatfs``,
the calling thread's file-system ids and capabilities (raw syscalls: per thread, never the
whole process's), and the descriptors of the sandbox's init that every way in starts from
(``/proc/<init>`` checked against the init's start time).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any

from e2bfacade.runtime.base import GuestFileError, SandboxNotFound

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
SYS_OPENAT2 = 437
SYS_SETFSUID = 122
SYS_SETFSGID = 123
SYS_SETGROUPS = 116
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]


def openat2(root_fd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """``path`` opened as if ``root_fd`` were ``/``: every component, symlinks and ``..``
    included, is resolved inside it, and magic links are refused; ``resolve``: more
    ``RESOLVE_*`` flags (``RESOLVE_NO_XDEV``: no mount point crossed)."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | resolve)
    fd = _libc.syscall(SYS_OPENAT2, root_fd, os.fsencode(path), ctypes.byref(how), 24)
    if fd < 0:
        err = ctypes.get_errno()
        raise GuestFileError(err, f"{path}: {os.strerror(err)}")
    return int(fd)


def fs_type(fd: int) -> int | None:
    """The magic number of the file system ``fd`` is on (``fstatfs``), or None."""
    buf = _StatFs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) == 0:
        return int(buf.f_type)
    return None


def _fs_ids(uid: int, gid: int) -> None:
    # Raw syscalls: they change only the calling thread (glibc's wrappers would change
    # every thread of the process). A non-zero fsuid clears the file capabilities.
    _libc.syscall(SYS_SETGROUPS, 0, None)
    _libc.syscall(SYS_SETFSGID, gid)
    _libc.syscall(SYS_SETFSUID, uid)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


SYS_CAPGET, SYS_CAPSET = 125, 126
CAP_VERSION_3 = 0x20080522
# What guest root may do to its own files whoever owns them (its in-guest capabilities).
ROOT_FILE_CAPS = (0, 1, 2, 3)  # CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def _caps() -> tuple[_CapHeader, Any]:
    header = _CapHeader(CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _libc.syscall(SYS_CAPGET, ctypes.byref(header), data)
    return header, data


@contextlib.contextmanager
def as_guest_user(uid: int, gid: int, *, guest_root: bool) -> Iterator[None]:
    """File-system ids of host ``uid``/``gid`` for the calling thread, restored afterwards.
    A non-zero fsuid drops the host's file capabilities; for the guest's root, the file
    capabilities it holds inside its own namespace are raised again (for this thread only:
    raw capset), since every path is resolved inside the guest's tree."""
    groups = os.getgroups()
    header, saved = _caps()
    _fs_ids(uid, gid)
    try:
        if guest_root:
            _, data = _caps()
            for cap in ROOT_FILE_CAPS:
                data[0].effective |= 1 << cap
            _libc.syscall(SYS_CAPSET, ctypes.byref(header), data)
        yield
    finally:
        _libc.syscall(SYS_SETFSUID, 0)
        _libc.syscall(SYS_SETFSGID, 0)
        _libc.syscall(SYS_CAPSET, ctypes.byref(header), saved)
        arr = (ctypes.c_uint * max(len(groups), 1))(*groups)
        _libc.syscall(SYS_SETGROUPS, len(groups), arr)


class SandboxGone(SandboxNotFound):
    """The sandbox's init died between the state check and the operation."""


def open_init(init_pid: int, init_start: int, name: str, flags: int) -> int:
    """``/proc/<init>/<name>`` of the sandbox's init, opened with ``flags``.

    Through a descriptor of ``/proc/<pid>`` checked against the init's start time: that
    directory stands for that one process (once it dies, lookups through it fail), so a
    pid reused by a host process after the init died can never hand us the host's root
    (or its network namespace)."""
    try:
        proc = os.open(f"/proc/{init_pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SandboxGone(f"the sandbox's init {init_pid} is gone") from None
    try:
        with open(os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if int(fields[19]) != init_start or fields[0] in ("Z", "X"):
            raise SandboxGone(f"the sandbox's init {init_pid} is gone")
        return os.open(name, flags | os.O_CLOEXEC, dir_fd=proc)
    except (ProcessLookupError, FileNotFoundError):
        # Gone between the check and the open (an exited init's root and namespaces
        # vanish before its /proc directory does).
        raise SandboxGone(f"the sandbox's init {init_pid} is gone") from None
    finally:
        os.close(proc)


def open_guest_root(init_pid: int, init_start: int) -> int:
    """An ``O_PATH`` descriptor of the sandbox's root directory, as its init sees it."""
    return open_init(init_pid, init_start, "root", os.O_PATH | os.O_DIRECTORY)
