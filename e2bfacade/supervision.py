"""Process supervision for the service's own processes (``manage.py serve``, the data plane's
master, gunicorn's workers): no process outlives the one that started it, and no port
counts as served until the process started for it is the one listening.

- :func:`die_with_parent`: a forked or started process asks the kernel for a signal when
  its parent dies (``PR_SET_PDEATHSIG``), then checks that its parent is still the one
  that forked it (it may have died before the request was made). A SIGKILLed master then
  takes its workers with it instead of leaving them listening, answering and holding the
  port against the next start.
- :func:`port_holders` and :func:`wait_port_free`: who listens on a port (from
  ``/proc/net/tcp`` and every process's file descriptors), so that a start on a port still
  held says by whom instead of reporting ready while an old process answers.
- :func:`serves`: whether a port's listener belongs to a given process or its forks.

The runtime's detached helpers (sandboxd, the sandboxes) are not the service's: they run in
sessions of their own and deliberately outlive it, so that a restart keeps every sandbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Loaded before any fork: a child between fork and exec must not load libraries.
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
TCP_LISTEN = "0A"
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def die_with_parent(parent: int, signum: int = signal.SIGTERM) -> bool:
    """Have ``signum`` sent to this process when its parent dies; False when the parent is
    no longer ``parent`` (it died before the request, and this process was already
    reparented: no signal will come, and the caller must end itself).

    The setting survives ``exec`` and is cleared in the children of a fork, so the runtime's
    helpers that a worker starts never get it. It follows the parent *thread* that forked:
    every caller here forks from its main thread."""
    # prctl is variadic: its arguments are unsigned longs, given as such.
    args = (ctypes.c_ulong(signum), *(ctypes.c_ulong(0) for _ in range(3)))
    if _libc.prctl(PR_SET_PDEATHSIG, *args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    return os.getppid() == parent


def exit_with_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """:func:`die_with_parent`, ending this process at once when the parent is already gone
    (for a ``preexec_fn`` or a child just forked, before it serves anything)."""
    if not die_with_parent(parent, signum):
        os._exit(1)


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command})"


def _listening_inodes(port: int, addresses: set[Address]) -> set[str]:
    """The inodes of the TCP sockets listening on ``port`` at one of ``addresses`` or at a
    wildcard address (either way, a bind of ``port`` there fails)."""
    inodes = set()
    for table, width in (("tcp", 4), ("tcp6", 16)):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                hex_address, hex_port = fields[1].split(":")
                if fields[3] != TCP_LISTEN or int(hex_port, 16) != port:
                    continue
                raw = bytes.fromhex(hex_address)
                # /proc prints each 32-bit word in host order (little-endian here).
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
                address = ipaddress.ip_address(words)
                if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                    address = address.ipv4_mapped
                if address.is_unspecified or address in addresses or not addresses:
                    inodes.add(fields[9])
    return inodes


def _addresses(host: str) -> set[Address]:
    """``host``'s addresses; none (meaning: any listener on the port) for a wildcard."""
    try:
        found = {ipaddress.ip_address(host.strip("[]"))}
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            return set()
        found = {ipaddress.ip_address(info[4][0]) for info in infos}
    return set() if any(a.is_unspecified for a in found) else found


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _command(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in argv)[:200] or "?"


def port_holders(host: str, port: int) -> list[Holder]:
    """The processes holding a socket that listens on ``host:port`` (or on the port at a
    wildcard address), as far as this process can see them (its network namespace, and
    the processes whose descriptors it may read)."""
    inodes = _listening_inodes(port, _addresses(host))
    if not inodes:
        return []
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders = []
    for pid in _pids():
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                        holders.append(Holder(pid, _command(pid)))
                        break
    return holders


def port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (as the servers bind: ``SO_REUSEADDR``, so
    connections of an earlier listener that linger in TIME_WAIT do not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


class PortHeld(Exception):
    """A port the service must listen on is held by another process (the message names it)."""


def wait_port_free(
    host: str, port: int, what: str, seconds: float, report: Callable[[str], None]
) -> None:
    """Return once ``host:port`` can be bound, waiting up to ``seconds`` for its holder to
    go (an earlier instance still finishing its requests; ``report`` is told who, once);
    else raise :class:`PortHeld` naming the holder. An address that cannot be bound for
    another reason is left for the server to report."""
    deadline = time.monotonic() + seconds
    reported = False
    try:
        while not port_free(host, port):
            over = time.monotonic() >= deadline
            if reported and not over:
                time.sleep(0.1)
                continue
            by = ", ".join(map(str, port_holders(host, port))) or "a process not visible here"
            if over:
                raise PortHeld(
                    f"{host}:{port} ({what}) is in use by {by}: stop it, or choose another address"
                )
            report(f"{host}:{port} ({what}) is in use by {by}; waiting up to {seconds:g} s")
            reported = True
    except OSError:
        return


def _parents() -> dict[int, int]:
    parents = {}
    for pid in _pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            # The command (field 2) may hold spaces and parentheses: split after its end.
            parents[pid] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return parents


def descendants(pid: int) -> set[int]:
    """``pid`` and every process forked from it, or from those, that still runs."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo.extend(children.get(current, []))
    return found


def serves(pid: int, host: str, port: int) -> bool:
    """Whether ``host:port``'s listener is held by ``pid`` or one of its forks. A port has one
    listening socket (no server here sets ``SO_REUSEPORT``), so then no other process, an
    orphan of an earlier start say, is answering there."""
    holders = {h.pid for h in port_holders(host, port)}
    return bool(holders & descendants(pid))
