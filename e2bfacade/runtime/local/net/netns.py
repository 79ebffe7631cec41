"""A TCP connection into a sandbox's network namespace, from the host.

The socket is made by a short-lived thread that has joined the sandbox's network namespace
(``setns`` changes only the calling thread); a socket belongs to the namespace it was made
in, so it connects to the sandbox's own loopback wherever it is used afterwards. The
namespace is opened through a descriptor of ``/proc/<init>`` checked against the init's
start time, as the file operations open the guest's root, so a reused pid never leads into
another process's namespace."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading

from e2bfacade.runtime.base import GuestFileError
from e2bfacade.runtime.local.guest.syscalls import open_init

CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000
_libc = ctypes.CDLL(None, use_errno=True)


def _socket_in(netns_fd: int) -> socket.socket:
    """On a fresh thread: join the namespace, make the socket, and end (never return a
    thread to anyone while it is in a sandbox's namespace)."""
    made: list[socket.socket] = []
    failed: list[int] = []

    def inside() -> None:
        if _libc.setns(netns_fd, CLONE_NEWNET) != 0:
            failed.append(ctypes.get_errno())
            return
        made.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC))

    worker = threading.Thread(target=inside, name="e2bfacade-netns")
    worker.start()
    worker.join()
    if not made:
        code = failed[0] if failed else errno.EIO
        raise GuestFileError(code, f"cannot enter the sandbox's network: {os.strerror(code)}")
    return made[0]


def connect(init_pid: int, init_start: int, port: int, timeout: float) -> socket.socket:
    netns_fd = open_init(init_pid, init_start, "ns/net", os.O_RDONLY)
    try:
        sock = _socket_in(netns_fd)
    finally:
        os.close(netns_fd)
    sock.settimeout(timeout)
    try:
        sock.connect(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        code = exc.errno or errno.ECONNREFUSED
        raise GuestFileError(code, f"port {port} is not open in the sandbox") from None
    sock.settimeout(None)
    return sock


def set_hostname(init_pid: int, init_start: int, name: str) -> None:
    """Set the sandbox's host name from the host (its guest has no CAP_SYS_ADMIN to)."""
    uts_fd = open_init(init_pid, init_start, "ns/uts", os.O_RDONLY)
    failed: list[int] = []

    def inside() -> None:
        if (
            _libc.setns(uts_fd, CLONE_NEWUTS) != 0
            or _libc.sethostname(name.encode(), len(name.encode())) != 0
        ):
            failed.append(ctypes.get_errno())

    try:
        worker = threading.Thread(target=inside, name="e2bfacade-uts")
        worker.start()
        worker.join()
    finally:
        os.close(uts_fd)
    if failed:
        reason = os.strerror(failed[0])
        raise GuestFileError(failed[0], f"cannot set the sandbox's host name: {reason}")
