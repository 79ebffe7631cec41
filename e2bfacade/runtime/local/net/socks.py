"""The SOCKS5 client of the egress proxy (E2B's ``egressProxy``, RFC 1928, with RFC 1929
username/password): one CONNECT over an already-connected non-blocking socket.

A flow the proxy matched by name (an allowed domain, a transform rule's) is requested by
name (ATYP 3): the SOCKS server resolves it, as E2B's proxy does ("remote DNS"); any
other by the IPv4 address the guest dialled (ATYP 1). Home-made rather than
``python-socks``: it is the one exchange below, run on the proxy's own socket (marked, so
it leaves by the uplink, and checked against the never-reachable list before it is
dialled), which that library would want to open itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct

SECONDS = 10.0
REPLIES = {
    1: "general failure",
    2: "connection not allowed by ruleset",
    3: "network unreachable",
    4: "host unreachable",
    5: "connection refused",
    6: "TTL expired",
    7: "command not supported",
    8: "address type not supported",
}


class SocksError(OSError):
    """The SOCKS server refused or broke the exchange (the guest's connection is closed)."""


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` of an ``egressProxy.address`` (ValueError when it is not one)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{address!r} is not host:port")
    return host, int(port)


async def _exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await loop.sock_recv(sock, n - len(data))
        if not chunk:
            raise SocksError("the SOCKS server closed the connection")
        data += chunk
    return data


async def connect(
    sock: socket.socket,
    host: str,
    port: int,
    username: str | None = None,
    password: str | None = None,
) -> None:
    """Ask the SOCKS5 server on ``sock`` to CONNECT to ``host``:``port`` (an IPv4 address,
    or a name it resolves), authenticating when ``username`` is given."""
    loop = asyncio.get_running_loop()

    async def exchange() -> None:
        methods = b"\x02" if username is not None else b"\x00"
        await loop.sock_sendall(sock, b"\x05\x01" + methods)
        version, method = await _exactly(loop, sock, 2)
        if version != 5 or method != methods[0]:
            raise SocksError("the SOCKS server accepts none of the offered methods")
        if username is not None:
            user, pw = username.encode(), (password or "").encode()
            if len(user) > 255 or len(pw) > 255:
                raise SocksError("SOCKS credentials are at most 255 bytes each")
            await loop.sock_sendall(sock, bytes([1, len(user)]) + user + bytes([len(pw)]) + pw)
            if (await _exactly(loop, sock, 2))[1] != 0:
                raise SocksError("the SOCKS server refused the credentials")
        try:
            target = b"\x01" + ipaddress.IPv4Address(host).packed
        except ValueError:
            name = host.encode("idna")
            if len(name) > 255:
                raise SocksError("a name too long for SOCKS") from None
            target = b"\x03" + bytes([len(name)]) + name
        await loop.sock_sendall(sock, b"\x05\x01\x00" + target + struct.pack(">H", port))
        version, reply, _, kind = await _exactly(loop, sock, 4)
        if version != 5 or reply != 0:
            raise SocksError(f"the SOCKS server: {REPLIES.get(reply, f'reply {reply}')}")
        size = {1: 4, 4: 16}.get(kind)
        if size is None:
            size = (await _exactly(loop, sock, 1))[0]
        await _exactly(loop, sock, size + 2)  # the bound address and port

    try:
        await asyncio.wait_for(exchange(), SECONDS)
    except TimeoutError:
        raise SocksError("the SOCKS server did not answer in time") from None
