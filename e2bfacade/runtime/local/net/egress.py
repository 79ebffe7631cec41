"""The egress proxy: domain names in ``allowOut``, matched as E2B matches them.

A sandbox whose ``allowOut`` names a domain has its new TCP connections to ports 80 and 443
diverted here by nftables (network.py, ``proxied`` and ``divert``: TPROXY, so the accepted
socket's own address is the one the guest dialled, and the proxy listens on 127.0.0.1
only — nothing but diverted sandbox connections can reach it). The proxy reads the first
bytes the guest sends — the HTTP request's ``Host`` header on port 80, the TLS
ClientHello's server name on 443 — and decides in E2B's order:

1. the name matches an allowed domain (``example.com`` exactly, ``*.example.com`` any name
   below it but not itself, ``*`` anything): the proxy resolves the *name* itself, through
   the sandboxes' DNS servers, and connects to that address — never to the address the
   guest chose, so a guest cannot borrow an allowed name to reach another host;
2. otherwise the address the guest connected to is judged by the CIDR rules: allowed,
   denied, or (matched by neither) allowed.

The never-reachable list holds on both paths, for the address the proxy is about to dial:
the configured ranges, the sandboxes' range, the uplink's networks, and every address of
this host on any interface, as the kernel has them at that moment (hostaddrs.py). The
proxy dials from the host's network namespace, where the host's own addresses are
delivered locally before any routing mark applies; the kernel refuses that too
(network.py, ``proxy_out``). A refused connection is closed right after it was accepted (as
E2B's proxy does). Every socket the proxy opens carries the runtime's routing mark, so it
leaves by the sandboxes' uplink, never by the host's own routes.

Run as ``python -m e2bfacade.runtime.local.net.egress SANDBOX_ROOT [NETWORK_JSON]``
(``manage.py serve`` supervises it and gives it the service's networking configuration;
without one it takes what the root's runtime saved); it serves every sandbox of that root.
It claims the root's share of the host's network as every runtime process does
(roots.py), so a root that collides with another root of this host stops it at start
with a message naming the other root.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

import dns.exception
import dns.message
import dns.query
import dns.rdatatype

from e2bfacade.runtime.base import RuntimeUnavailable
from e2bfacade.runtime.local.net.hostaddrs import HostAddresses
from e2bfacade.runtime.local.net.network import SandboxNetwork, digest_of, load_config
from e2bfacade.runtime.local.net.rules import NetworkConfig
from e2bfacade.runtime.local.state import Layout

log = logging.getLogger(__name__)

IP_TRANSPARENT = 19  # <linux/in.h>: accept connections diverted by TPROXY
HEAD_MAX = 16 * 1024
HEAD_SECONDS = 10.0
CONNECT_SECONDS = 10.0
COPY = 1 << 16


def matches(name: str, domains: list[str]) -> bool:
    name = name.lower().rstrip(".")
    for domain in domains:
        if domain == "*" or name == domain:
            return True
        if domain.startswith("*.") and name.endswith(domain[1:]):
            return True
    return False


def server_name(hello: bytes) -> str | None:
    """The server name of a TLS ClientHello; None when absent or not (yet) complete."""
    try:
        if hello[0] != 0x16 or hello[5] != 0x01:
            return None
        pos = 5 + 4 + 2 + 32  # record and handshake headers, version, random
        pos += 1 + hello[pos]  # session id
        pos += 2 + struct.unpack_from(">H", hello, pos)[0]  # cipher suites
        pos += 1 + hello[pos]  # compression methods
        end = pos + 2 + struct.unpack_from(">H", hello, pos)[0]
        pos += 2
        while pos + 4 <= end:
            kind, size = struct.unpack_from(">HH", hello, pos)
            pos += 4
            if kind == 0:  # server_name: list length, type (0: host name), length, name
                length = struct.unpack_from(">H", hello, pos + 3)[0]
                raw = hello[pos + 5 : pos + 5 + length]
                return raw.decode("ascii") if len(raw) == length else None
            pos += size
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


def host_header(head: bytes) -> str | None:
    if b"\r\n\r\n" not in head:
        return None
    for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"host":
            host = value.strip().decode("ascii", errors="replace")
            if host.startswith("["):
                return host[1 : host.find("]")]
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return None


class EgressProxy:
    """The proxy of the root ``root``, with its service's networking ``config`` (None: as
    the root's runtime last saved it, once there is one)."""

    def __init__(self, root: Path, config: NetworkConfig | None = None) -> None:
        layout = Layout(root, claim_ids=False)  # the proxy starts no sandboxes
        while config is None:  # written by the service's first runtime, in a moment
            config = load_config(layout)
            if config is None:
                time.sleep(0.5)
        self.net = SandboxNetwork(layout, config, digest_of(root))
        self.net.setup()  # claims the root's port, or refuses naming the root in the way
        self.never = self.net.never_reachable()
        self.host = HostAddresses()

    def _socket(self, kind: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, kind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.net.mark)
        return s

    def _is_blocked(self, address: str) -> bool:
        """Whether ``address`` is never to be dialled: checked right before each dial."""
        ip = ipaddress.IPv4Address(address)
        if ip in self.host.addresses() or any(ip in net for net in self.never):
            return True
        return any(ip in net for net in self.host.networks(self.net.config.uplink))

    def resolve(self, name: str) -> str | None:
        """An IPv4 address of ``name`` from the sandboxes' DNS servers (None: none)."""
        query = dns.message.make_query(name, dns.rdatatype.A)
        for server in self.net.config.dns_servers:
            sock = self._socket(socket.SOCK_DGRAM)
            try:
                answer = dns.query.udp(query, server, timeout=3, sock=sock)
            except (OSError, dns.exception.DNSException):
                continue
            finally:
                sock.close()
            for rrset in answer.answer:
                for item in rrset:
                    if item.rdtype == dns.rdatatype.A:
                        return str(item.address)
        return None

    def decide(self, record: dict[str, Any], name: str | None, address: str) -> str | None:
        """Where to connect (an address), or None: refused."""
        domains = [str(d) for d in record.get("domains") or []]
        if name and matches(name, domains):
            resolved = self.resolve(name)
            return resolved if resolved and not self._is_blocked(resolved) else None
        if self._is_blocked(address):
            return None
        ip = ipaddress.IPv4Address(address)
        allow = [ipaddress.IPv4Network(n) for n in record.get("allow") or []]
        deny = [ipaddress.IPv4Network(n) for n in record.get("deny") or []]
        if any(ip in n for n in allow):
            return address
        if any(ip in n for n in deny):
            return None
        return address

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            guest = writer.get_extra_info("peername")[0]
            slot = self.net.slot_of_guest(guest)
            record = self.net.record(slot) if slot is not None else None
            if record is None:
                return
            # Diverted, not translated: the socket's own address is the guest's target.
            address, port = writer.get_extra_info("sockname")[:2]
            head, name = b"", None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + HEAD_SECONDS
            while len(head) < HEAD_MAX and name is None:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    chunk = await asyncio.wait_for(reader.read(HEAD_MAX - len(head)), left)
                except TimeoutError:
                    break
                if not chunk:
                    break
                head += chunk
                name = server_name(head) if port == 443 else host_header(head)
                if port == 443 and head[:1] != b"\x16":
                    break  # not TLS: no name to wait for
                if port != 443 and b"\r\n\r\n" in head:
                    break
            target = await loop.run_in_executor(None, self.decide, record, name, address)
            if target is None:
                log.info("refused %s -> %s:%d (name %r)", guest, address, port, name)
                return
            out = self._socket(socket.SOCK_STREAM)
            out.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(out, (target, port)), CONNECT_SECONDS)
            except (TimeoutError, OSError):
                out.close()
                return
            up_reader, upstream = await asyncio.open_connection(sock=out, limit=COPY)
            upstream.write(head)
            await asyncio.gather(_copy(reader, upstream), _copy(up_reader, writer))
        except (OSError, ValueError):
            pass
        except Exception:  # noqa: BLE001 - one connection's failure is logged, not fatal
            log.exception("egress proxy: a connection failed")
        finally:
            for w in (writer, upstream):
                if w is not None:
                    with contextlib.suppress(OSError):
                        w.close()

    def listener(self) -> socket.socket:
        """The listening socket: 127.0.0.1 and the root's port, transparent (it accepts the
        connections TPROXY diverts to it, whatever address they were for)."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        s.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        port = self.net.proxy_port
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            s.close()
            raise RuntimeUnavailable(
                f"the egress proxy of {self.net.layout.root} cannot listen on 127.0.0.1:{port}: "
                f"{exc.strerror}; set SANDBOX_EGRESS_PORT to a free port (or 'auto')"
            ) from None
        s.setblocking(False)
        return s

    async def serve(self) -> None:
        server = await asyncio.start_server(self.handle, sock=self.listener(), backlog=1024)
        async with server:
            await server.serve_forever()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(COPY):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        with contextlib.suppress(OSError):
            writer.close()


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(
            "usage: python -m e2bfacade.runtime.local.net.egress SANDBOX_ROOT [NETWORK_JSON]",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO)
    # ``manage.py serve`` gives its own configuration: what the root saved may be an older
    # run's (one that was refused, say).
    config = NetworkConfig.from_json(json.loads(argv[1])) if len(argv) == 2 else None
    try:
        proxy = EgressProxy(Path(argv[0]), config)
        asyncio.run(proxy.serve())
    except RuntimeUnavailable as exc:
        print(f"egress proxy: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
