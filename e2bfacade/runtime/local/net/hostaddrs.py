"""The host's own IPv4 addresses, on every interface, kept current from the kernel.

The egress proxy dials from the host's network namespace, where a connection to any of the
host's addresses is delivered to the host itself: the ``local`` routing table is looked up
(``ip rule`` 0) before the proxy's routing mark is. So the proxy refuses every one of them,
and the networks of the uplink, whatever a sandbox's rules allow (egress.py).

The addresses are read once (a netlink dump) and then follow the kernel's address
notifications (``RTMGRP_IPV4_IFADDR``), which the kernel queues on this socket before the
change that caused them returns (``ip addr add`` has not returned yet when the message is
queued). Every question first takes in what is queued, so an address the host gains is
known from the moment it exists: no polling, no thread, and a question costs one
non-blocking ``recv`` when nothing changed. Should the queue overflow (``ENOBUFS``: a burst
of changes no question drained), the addresses are dumped afresh.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import threading
from collections.abc import Iterator

NETLINK_ROUTE = 0
RTMGRP_IPV4_IFADDR = 0x10
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFA_ADDRESS, IFA_LOCAL = 1, 2
NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
RTATTR = struct.Struct("=HH")  # length, type
RECV = 1 << 17  # more than a dump's largest message batch (32 KiB on current kernels)

Entry = tuple[int, ipaddress.IPv4Address, int]  # interface index, address, prefix length


class HostAddresses:
    """The host's IPv4 addresses. Safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Subscribed before the dump: a change during the dump is in the queue afterwards,
        # and applying it again (an add or a removal of a set member) is harmless.
        self._events = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE
        )
        self._events.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._events.bind((0, RTMGRP_IPV4_IFADDR))
        self._entries: set[Entry] = _dump()
        self._addresses = frozenset(e[1] for e in self._entries)

    def close(self) -> None:
        self._events.close()

    def addresses(self) -> frozenset[ipaddress.IPv4Address]:
        """Every address of every interface of the host, as of now."""
        with self._lock:
            self._take_in()
            return self._addresses

    def networks(self, ifname: str) -> list[ipaddress.IPv4Network]:
        """The networks of ``ifname``'s addresses, as of now (none if it does not exist)."""
        try:
            index = socket.if_nametoindex(ifname)
        except OSError:
            return []
        with self._lock:
            self._take_in()
            return [
                ipaddress.IPv4Network(f"{address}/{length}", strict=False)
                for i, address, length in self._entries
                if i == index
            ]

    def _take_in(self) -> None:
        changed = False
        while True:
            try:
                data = self._events.recv(RECV, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                # Changes were lost: what is still queued is older than a dump made now,
                # so drop it, then read everything afresh.
                self._drain()
                self._entries = _dump()
                changed = True
                continue
            for kind, body in _messages(data):
                entry = _entry(body) if kind in (RTM_NEWADDR, RTM_DELADDR) else None
                if entry is None:
                    continue
                if kind == RTM_NEWADDR:
                    self._entries.add(entry)
                else:
                    self._entries.discard(entry)
                changed = True
        if changed:
            self._addresses = frozenset(e[1] for e in self._entries)

    def _drain(self) -> None:
        for _ in range(100_000):  # bounded: a host changing addresses without end
            try:
                self._events.recv(RECV, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise


def _dump() -> set[Entry]:
    with socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE
    ) as s:
        s.settimeout(10)
        s.bind((0, 0))
        request = IFADDRMSG.pack(socket.AF_INET, 0, 0, 0, 0)
        header = NLMSG.pack(
            NLMSG.size + len(request), RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1, 0
        )
        s.send(header + request)
        entries: set[Entry] = set()
        while True:
            for kind, body in _messages(s.recv(RECV)):
                if kind == NLMSG_DONE:
                    return entries
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", body)[0]
                    raise OSError(code, f"netlink address dump: {errno.errorcode.get(code)}")
                entry = _entry(body) if kind == RTM_NEWADDR else None
                if entry is not None:
                    entries.add(entry)


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + NLMSG.size <= len(data):
        length, kind, _flags, _seq, _port = NLMSG.unpack_from(data, offset)
        if length < NLMSG.size:
            return
        yield kind, data[offset + NLMSG.size : offset + length]
        offset += (length + 3) & ~3


def _entry(body: bytes) -> Entry | None:
    """An ``ifaddrmsg`` and its attributes: the interface's own address (IFA_LOCAL; on a
    point-to-point link IFA_ADDRESS is the peer's), or None for another family."""
    if len(body) < IFADDRMSG.size:
        return None
    family, length, _flags, _scope, index = IFADDRMSG.unpack_from(body)
    if family != socket.AF_INET:
        return None
    found: dict[int, bytes] = {}
    offset = IFADDRMSG.size
    while offset + RTATTR.size <= len(body):
        size, kind = RTATTR.unpack_from(body, offset)
        if size < RTATTR.size:
            break
        found[kind] = body[offset + RTATTR.size : offset + size]
        offset += (size + 3) & ~3
    raw = found.get(IFA_LOCAL) or found.get(IFA_ADDRESS)
    if raw is None or len(raw) != 4:
        return None
    return index, ipaddress.IPv4Address(raw), length
