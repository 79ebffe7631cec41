"""TLS for transform rules over HTTPS: the egress proxy's certificate authority, the
certificates it mints per domain, and a TLS server over a connection whose first bytes
(the ClientHello) the proxy has already read.

**One CA per runtime root (per service), not per sandbox.** Its certificate is seeded into
every sandbox's trust store when the sandbox is made (guest/seed.py), so a sandbox whose
rules are added later by ``PUT /network`` already trusts it; its key stays in the root
(``net/egress-ca/``, 0700 root) and never enters a sandbox, so no guest can mint with it
— one per sandbox would add nothing to that, and would cost a certificate per domain *per
sandbox* (minted on each one's first request) instead of one per domain.

**Certificates** are minted with ``cryptography`` (a P-256 key shared by every leaf, a
leaf per server name, valid for 7 days, re-minted at half-life) and kept in memory (an
``ssl.SSLContext`` each, at most ``CACHE`` names). Against mitmproxy on the same endpoint
(bench/egress_tls_mitm_bench.py, docs/networking.md): +1.7 ms p50 per kept-alive request
over the direct path against its +6.5, half its CPU per request and half its memory per
connection (73 KiB); it mints quicker (0.46 against 1.75 ms p50), once per name. What
it would add is its own proxy core (HTTP/2, an addon API) that the proxy's TPROXY
accept, never-reachable checks and name-pinned dialling would have to be fitted into:
the proxy stays ours.

The upstream side is verified against the host's trust store (OpenSSL's defaults) and the
configuration's ``extra_ca`` (the suite's test internet's CA), for the name the guest
asked for: the proxy only ever writes a secret into a connection to a server that proved
it is that name.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import ipaddress
import os
import ssl
import time
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DIR = "net/egress-ca"
CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
CACHE = 1024
LEAF_DAYS = 7
READ = 1 << 16


def ca_paths(root: Path) -> tuple[Path, Path]:
    d = root / CA_DIR
    return d / CA_CERT, d / CA_KEY


def ensure_ca(root: Path) -> Path:
    """The root's CA certificate (PEM), made on first use under a lock (the runtime and
    the proxy may both be first). Returns the certificate's path."""
    cert_path, key_path = ca_paths(root)
    if cert_path.is_file():
        return cert_path
    cert_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(cert_path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cert_path.is_file():
            return cert_path
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name(
            [
                x509.NameAttribute(
                    NameOID.COMMON_NAME, f"e2bfacade egress proxy CA {os.urandom(4).hex()}"
                )
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )  # fmt: skip
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        key_bytes = key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # The key first, then the certificate, each renamed into place: a certificate on
        # disk always has its key beside it.
        for path, data, mode in (
            (key_path, key_bytes, 0o600),
            (cert_path, cert.public_bytes(pem), 0o644),
        ):
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.chmod(mode)
            tmp.rename(path)
    return cert_path


class Authority:
    """The root's CA, minting server certificates for the names a rule's connections ask
    for (cached)."""

    def __init__(self, root: Path) -> None:
        cert_path, key_path = ca_paths(root)
        ensure_ca(root)
        self.ca = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        self.ca_key = key
        self.leaf_key = ec.generate_private_key(ec.SECP256R1())
        # ssl loads a key from a file only: an anonymous one in memory (never on a disk),
        # made once. The traditional "EC PRIVATE KEY" form: OpenSSL 3 decodes PKCS#8 by
        # trying its decoders in turn, about three times as slow for every leaf loaded.
        self._key_fd = os.memfd_create("e2bfacade-egress-leaf-key", os.MFD_CLOEXEC)
        os.write(
            self._key_fd,
            self.leaf_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            ),
        )
        self.contexts: OrderedDict[str, tuple[float, ssl.SSLContext]] = OrderedDict()

    def context(self, name: str) -> ssl.SSLContext:
        """A server context presenting a certificate for ``name`` (HTTP/1.1 only)."""
        now = time.monotonic()
        cached = self.contexts.get(name)
        if cached is not None and cached[0] > now:
            self.contexts.move_to_end(name)
            return cached[1]
        context = self._mint(name)
        self.contexts[name] = (now + LEAF_DAYS * 86400 / 2, context)
        while len(self.contexts) > CACHE:
            self.contexts.popitem(last=False)
        return context

    def _mint(self, name: str) -> ssl.SSLContext:
        now = datetime.datetime.now(datetime.UTC)
        san: x509.GeneralName
        try:
            san = x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            san = x509.DNSName(name)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
            .issuer_name(self.ca.subject)
            .public_key(self.leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                critical=False,
            )
            .sign(self.ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        chain = cert.public_bytes(pem) + self.ca.public_bytes(pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # HTTP/1.1 only: the proxy rewrites HTTP/1.x; a client that offers h2 falls back.
        context.set_alpn_protocols(["http/1.1"])
        # The chain through an anonymous in-memory file too, closed at once.
        chain_fd = os.memfd_create("e2bfacade-egress-leaf", os.MFD_CLOEXEC)
        try:
            os.write(chain_fd, chain)
            context.load_cert_chain(f"/proc/self/fd/{chain_fd}", f"/proc/self/fd/{self._key_fd}")
        finally:
            os.close(chain_fd)
        return context


def upstream_context(extra_ca: str | None) -> ssl.SSLContext:
    """How the proxy verifies a rule's destination: the host's trust store plus
    ``extra_ca``, hostname checked, HTTP/1.1 offered."""
    context = ssl.create_default_context()
    if extra_ca:
        context.load_verify_locations(extra_ca)
    context.set_alpn_protocols(["http/1.1"])
    return context


class TlsStream:
    """TLS over a connection's asyncio streams, through memory buffers: the server side of
    a guest's connection (starting from ``first``, the bytes the proxy already read from it:
    the ClientHello), or, given ``server_hostname``, the client side of the connection to
    a rule's destination (verified for that name by ``context``). Offers what the proxy's
    relays use of a stream: ``read``, ``write``, ``drain``, ``can_write_eof``,
    ``write_eof``, ``close``.

    Not asyncio's own TLS transport for the upstream side: that one holds a 256 KiB read
    buffer per connection from the start (``SSLProtocol.max_size``), which was two thirds
    of an intercepted connection's memory (bench/egress_tls_mitm_bench.py)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
        first: bytes = b"",
        server_hostname: str | None = None,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(
            self.incoming,
            self.outgoing,
            server_side=server_hostname is None,
            server_hostname=server_hostname,
        )
        self.incoming.write(first)

    def _send(self) -> None:
        data = self.outgoing.read()
        if data:
            self.writer.write(data)

    async def _fill(self) -> None:
        self._send()
        await self.writer.drain()
        chunk = await self.reader.read(READ)
        if chunk:
            self.incoming.write(chunk)
        else:
            self.incoming.write_eof()

    async def handshake(self) -> None:
        """The TLS handshake; the client side verifies the server's certificate here (an
        ``ssl.SSLCertVerificationError`` when it fails)."""
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if self.incoming.eof:
                    raise ConnectionError("the peer closed during the handshake") from None
                await self._fill()
        self._send()
        await self.writer.drain()

    async def read(self, n: int = READ) -> bytes:
        while True:
            try:
                return self.tls.read(n)
            except ssl.SSLWantReadError:
                if self.incoming.eof:
                    return b""
                await self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    def write(self, data: bytes) -> None:
        if data:
            self.tls.write(data)
            self._send()

    async def drain(self) -> None:
        await self.writer.drain()

    def can_write_eof(self) -> bool:
        # The guest's side only: toward the destination, as asyncio's TLS transport
        # did, no half-close (the destination's answer is read to its end either way).
        return self.tls.server_side

    def write_eof(self) -> None:
        with contextlib.suppress(ssl.SSLError, OSError):
            self.tls.unwrap()
        self._send()
        with contextlib.suppress(OSError):
            if self.writer.can_write_eof():
                self.writer.write_eof()

    def close(self) -> None:
        self.writer.close()
