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

**Transform rules** (E2B's ``network.rules``, transform.py): a sandbox whose rules name
the request's domain has its HTTP requests to that domain rewritten on the way out — the
rule's headers written in, their placeholders resolved by the proxy's resolver. Such a
connection is always dialled to the address the proxy resolves for the *name* (then
judged by the sandbox's rules as any other: an allowed domain, else its CIDR rules), never
to the one the guest chose: a guest cannot have a secret sent to an address it picked.
Each request on it is parsed, and one for another host ends the connection. What comes
back has the values written in masked (transform.Masker).

**egressProxy** (socks.py): a sandbox with one has every new TCP connection diverted
here, on any port; it is judged as above, then tunnelled through the SOCKS5 server — by
name when it matched one (an allowed domain, a rule's), else by the address dialled. The
server's own address is checked like any the proxy dials; its password comes from the
resolver (kind ``egressProxy``) when it connects, never from a record.

Run as ``python -m e2bfacade.runtime.local.net.egress SANDBOX_ROOT [NETWORK_JSON]``
(``manage.py serve`` supervises it and gives it the service's networking configuration;
without one it takes what the root's runtime saved); it serves every sandbox of that root.
It claims the root's share of the host's network as every runtime process does
(roots.py), so a root that collides with another root of this host stops it at start
with a message naming the other root. Without a resolver (run so, rather than by
``manage.py run_egress``) no placeholder resolves: rule headers holding one are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dns.exception
import dns.message
import dns.query
import dns.rdatatype

from e2bfacade.runtime.base import RuntimeUnavailable
from e2bfacade.runtime.local.net import socks
from e2bfacade.runtime.local.net.hostaddrs import HostAddresses
from e2bfacade.runtime.local.net.network import SandboxNetwork, digest_of, load_config
from e2bfacade.runtime.local.net.rules import PROXY_PORTS, NetworkConfig
from e2bfacade.runtime.local.net.tls import Authority, TlsStream, upstream_context
from e2bfacade.runtime.local.net.transform import (
    BadRequest,
    Masker,
    body_framing,
    parse_head,
    rewrite,
    rule_for,
)
from e2bfacade.runtime.local.state import Layout

log = logging.getLogger(__name__)

IP_TRANSPARENT = 19  # <linux/in.h>: accept connections diverted by TPROXY
HEAD_MAX = 16 * 1024
HEAD_SECONDS = 10.0
CONNECT_SECONDS = 10.0
COPY = 1 << 16
IDLE_FLUSH = 0.05  # seconds a masked stream may pause before what it holds back is sent

# (sandbox id, placeholder kind, name) -> the value, or None: unknown, revoked, not allowed.
Resolver = Callable[[str, str, str], "str | None"]


def nodelay(sock: Any) -> None:
    """Nagle's algorithm off, as asyncio does only for sockets made with an explicit
    ``IPPROTO_TCP`` (the proxy's are not): a relayed answer that comes in two pieces (a
    head, then a body; a stream) had its second wait for the peer's delayed ACK, ~40 ms."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


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

    def __init__(
        self, root: Path, config: NetworkConfig | None = None, resolve: Resolver | None = None
    ) -> None:
        self.resolve_placeholder: Resolver = resolve or (lambda sandbox, kind, name: None)
        layout = Layout(root, claim_ids=False)  # the proxy starts no sandboxes
        while config is None:  # written by the service's first runtime, in a moment
            config = load_config(layout)
            if config is None:
                time.sleep(0.5)
        self.net = SandboxNetwork(layout, config, digest_of(root))
        self.net.setup()  # claims the root's port, or refuses naming the root in the way
        self.never = self.net.never_reachable()
        self.host = HostAddresses()
        self.authority = Authority(root)  # TLS for the domains of transform rules (tls.py)
        self.upstream_tls = upstream_context(config.extra_ca)

    def _socket(self, kind: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, kind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.net.mark)
        if kind == socket.SOCK_STREAM:
            nodelay(s)
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

    def decide(
        self, record: dict[str, Any], name: str | None, address: str, *, by_name: bool = False
    ) -> str | None:
        """Where to connect (an address), or None: refused. ``by_name``: the connection
        must go where ``name`` resolves, whatever the guest dialled (a transform rule's)."""
        domains = [str(d) for d in record.get("domains") or []]
        if name and matches(name, domains):
            resolved = self.resolve(name)
            return resolved if resolved and not self._is_blocked(resolved) else None
        if by_name:
            resolved = self.resolve(name) if name else None
            if resolved is None:
                return None
            address = resolved
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
        nodelay(writer.get_extra_info("socket"))
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
            # Other ports (a tunnelled sandbox's) may wait for the server to speak first.
            while port in PROXY_PORTS and len(head) < HEAD_MAX and name is None:
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
            # Only a rule's domain is ever intercepted (TLS terminated, requests parsed):
            # everything else is relayed as the bytes it is.
            rule = rule_for(name, record.get("transforms") or {}) if port in (80, 443) else None
            tunnel = record.get("upstream")
            target: str | None
            if tunnel and name and matches(name, record.get("domains") or []):
                target = name  # allowed by name: the SOCKS server resolves it (remote DNS)
            else:
                target = await loop.run_in_executor(
                    None, functools.partial(self.decide, by_name=rule is not None),
                    record, name, address,
                )  # fmt: skip
                if target is not None and tunnel and name and rule is not None:
                    target = name  # a rule's: judged by where it resolves, asked for by name
            if target is None:
                log.info("refused %s -> %s:%d (name %r)", guest, address, port, name)
                return
            try:
                out = await self._dial(tunnel, str(record.get("sandbox_id") or ""), target, port)
            except (TimeoutError, OSError) as exc:
                log.info("egress: could not reach %s:%d: %s", target, port, exc)
                return
            if rule is not None and name is not None:
                await self._intercept(reader, writer, out, port, head, name, rule, record)
                return
            up_reader, upstream = await asyncio.open_connection(sock=out, limit=COPY)
            upstream.write(head)
            await asyncio.gather(_copy(reader, upstream), _copy(up_reader, writer))
        except ssl.SSLCertVerificationError as exc:
            log.info("egress: a rule's destination failed verification: %s", exc.verify_message)
        except (OSError, ValueError):
            pass
        except Exception:  # noqa: BLE001 - one connection's failure is logged, not fatal
            log.exception("egress proxy: a connection failed")
        finally:
            for w in (writer, upstream):
                if w is not None:
                    with contextlib.suppress(OSError):
                        w.close()

    async def _dial(
        self, tunnel: dict[str, Any] | None, sandbox: str, host: str, port: int
    ) -> socket.socket:
        """A connected socket to ``host``:``port``: directly (``host`` an address the rules
        allowed), or through the sandbox's SOCKS5 server (``tunnel``; ``host`` may then be
        a name), whose own address is checked like any the proxy dials."""
        loop = asyncio.get_running_loop()
        out = self._socket(socket.SOCK_STREAM)
        out.setblocking(False)
        try:
            if tunnel is None:
                await asyncio.wait_for(loop.sock_connect(out, (host, port)), CONNECT_SECONDS)
                return out
            server, server_port = socks.split_address(str(tunnel["address"]))
            try:
                server_ip = str(ipaddress.IPv4Address(server))
            except ValueError:
                resolved: str | None = await loop.run_in_executor(None, self.resolve, server)
                server_ip = resolved or ""
            if not server_ip or self._is_blocked(server_ip):
                raise OSError(f"the egress proxy {tunnel['address']} is not reachable")
            await asyncio.wait_for(
                loop.sock_connect(out, (server_ip, server_port)), CONNECT_SECONDS
            )
            username = tunnel.get("username")
            password = None
            if username is not None:
                password = await loop.run_in_executor(
                    None, self.resolve_placeholder, sandbox, "egressProxy", "password"
                )
            await socks.connect(out, host, port, username, password)
            return out
        except BaseException:
            out.close()
            raise

    async def _intercept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        out: socket.socket,
        port: int,
        head: bytes,
        name: str,
        rule: dict[str, str],
        record: dict[str, Any],
    ) -> None:
        """A connection to a rule's domain: on 443, TLS is verified to the destination
        (for ``name``) before the guest's handshake is answered with a certificate minted
        for ``name``; then the requests are rewritten and the answers masked."""
        guest_in: Any = reader
        guest_out: Any = writer
        up_reader: Any
        upstream: Any
        up_reader, upstream = await asyncio.open_connection(sock=out, limit=COPY)
        try:
            if port == 443:
                up_tls = TlsStream(up_reader, upstream, self.upstream_tls, server_hostname=name)
                await asyncio.wait_for(up_tls.handshake(), CONNECT_SECONDS)
                up_reader = upstream = up_tls
                tls = TlsStream(reader, writer, self.authority.context(name), first=head)
                await asyncio.wait_for(tls.handshake(), HEAD_SECONDS)
                guest_in = guest_out = tls
                head = b""
            masker = Masker()
            sandbox = str(record.get("sandbox_id") or "")
            await asyncio.gather(
                self._transform(guest_in, upstream, head, name, rule, sandbox, masker),
                _copy(up_reader, guest_out, masker),
            )
        finally:
            with contextlib.suppress(OSError):
                upstream.close()

    async def _transform(
        self,
        reader: Any,
        upstream: Any,
        head: bytes,
        name: str,
        rule: dict[str, str],
        sandbox: str,
        masker: Masker,
    ) -> None:
        """Relay the guest's requests to ``name`` with ``rule``'s headers written in, one
        request at a time (keep-alive: each is parsed; one for another host, or one the
        proxy cannot frame exactly, ends the connection, nothing of it forwarded)."""
        loop = asyncio.get_running_loop()
        buffer = head

        def resolve(kind: str, ref: str) -> str | None:
            return self.resolve_placeholder(sandbox, kind, ref)

        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    if len(buffer) > HEAD_MAX:
                        return
                    chunk = await reader.read(COPY)
                    if not chunk:
                        return
                    buffer += chunk
                raw, buffer = buffer.split(b"\r\n\r\n", 1)
                request = parse_head(raw)
                if request.host() != name:
                    log.info("egress: a request for another host ended a connection to %s", name)
                    return
                length = body_framing(request)
                # Resolved per request, off the event loop: a new version or a revoke
                # applies from the next request on.
                new_head, values = await loop.run_in_executor(None, rewrite, request, rule, resolve)
                masker.add(values)
                upstream.write(new_head)
                buffer = await _relay_body(reader, upstream, buffer, length)
                await upstream.drain()
        except BadRequest as exc:
            log.info("egress: closed a connection to %s: %s", name, exc)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                if upstream.can_write_eof():
                    upstream.write_eof()

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


async def _copy(reader: Any, writer: Any, masker: Masker | None = None) -> None:
    """Relay ``reader`` to ``writer`` (asyncio streams, or tls.TlsStream), masking what
    ``masker`` holds when given."""
    try:
        while True:
            if masker is None:
                chunk = await reader.read(COPY)
            else:
                try:  # a pause in the stream releases what the masker holds back
                    chunk = await asyncio.wait_for(reader.read(COPY), IDLE_FLUSH)
                except TimeoutError:
                    writer.write(masker.flush())
                    chunk = await reader.read(COPY)
            if not chunk:
                break
            writer.write(chunk if masker is None else masker.feed(chunk))
            await writer.drain()
        if masker is not None:
            writer.write(masker.flush())
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        with contextlib.suppress(OSError):
            writer.close()


async def _relay_body(reader: Any, upstream: Any, buffer: bytes, length: int | None) -> bytes:
    """Forward one request body (``length`` bytes, or chunked: None) from ``buffer`` and
    then ``reader``; return what follows it (the next request's start)."""

    async def some(limit: int) -> bytes:
        """Between 1 and ``limit`` bytes of the body."""
        nonlocal buffer
        if not buffer:
            buffer = await reader.read(COPY)
            if not buffer:
                raise asyncio.IncompleteReadError(b"", limit)
        out, buffer = buffer[:limit], buffer[limit:]
        return out

    async def forward(n: int) -> None:
        while n > 0:
            part = await some(n)
            upstream.write(part)
            n -= len(part)
            await upstream.drain()

    async def line() -> bytes:
        nonlocal buffer
        while b"\r\n" not in buffer:
            if len(buffer) > HEAD_MAX:
                raise BadRequest("a chunk header too long")
            chunk = await reader.read(COPY)
            if not chunk:
                raise asyncio.IncompleteReadError(buffer, None)
            buffer += chunk
        out, buffer = buffer.split(b"\r\n", 1)
        return out + b"\r\n"

    if length is not None:
        await forward(length)
        return buffer
    while True:  # chunked: size line, data, CRLF; a zero size ends it, then trailers
        size_line = await line()
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadRequest("a malformed chunk size") from None
        upstream.write(size_line)
        if size == 0:
            while (trailer := await line()) != b"\r\n":
                upstream.write(trailer)
            upstream.write(b"\r\n")
            return buffer
        await forward(size)
        if await line() != b"\r\n":  # what the destination would read as the next size
            raise BadRequest("a chunk not followed by CRLF")
        upstream.write(b"\r\n")


def main(argv: list[str], resolve: Resolver | None = None) -> int:
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
        proxy = EgressProxy(Path(argv[0]), config, resolve)
        asyncio.run(proxy.serve())
    except RuntimeUnavailable as exc:
        print(f"egress proxy: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
