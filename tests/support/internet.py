"""The suite's own "internet": a network namespace the tests make, joined to the host by a
veth pair, with web and DNS servers on addresses that stand for public ones. Sandboxes get
it as their uplink, so every network test runs on this machine: no packet ever goes to an
address outside loopback and the namespaces made here (the runtime routes sandbox traffic
by its own table, through the uplink only).

Inside the namespace, on its loopback:

- ``1.1.1.1`` and ``8.8.8.8``: DNS (UDP and TCP 53) and HTTP(S) (80, 443), answering
  as E2B's network tests expect of them (``https://1.1.1.1`` 301, ``https://8.8.8.8`` 302);
- ``203.0.113.10`` (``allowed.example``, ``www.allowed.example``,
  ``connectivitycheck.gstatic.com``), ``203.0.113.20`` (``denied.example``),
  ``203.0.113.30`` (``other.example``): web servers whose answer names the address that
  served and the Host header it got; on ``/headers`` also every request header it got
  (``headers``: [name, value] pairs; ``sha256``: each value's digest; appended in full
  to ``requests.jsonl`` in the internet's directory), and
  ``/redirect/<url>`` answers 307 to ``<url>``;
- ``<a>-<b>-<c>-<d>.ip.example`` resolves to the address ``a.b.c.d``, whatever it is (a name
  for an address a test gives the host, say);
- port 5001 on every address: a sink for throughput measurements.

HTTPS is served with a certificate of the test internet's own CA (``ca_path``), for every
name and address above. Run ``python -m tests.support.internet serve CONFIG`` inside the
namespace (done by :class:`TestInternet`).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import http.server
import ipaddress
import itertools
import json
import os
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.support.waiting import eventually

NAMES = {
    "allowed.example": "203.0.113.10",
    "www.allowed.example": "203.0.113.10",
    "connectivitycheck.gstatic.com": "203.0.113.10",
    "denied.example": "203.0.113.20",
    "other.example": "203.0.113.30",
}
DNS_SERVERS = ("8.8.8.8", "1.1.1.1")
ADDRESSES = ("1.1.1.1", "8.8.8.8", "203.0.113.10", "203.0.113.20", "203.0.113.30")
SINK_PORT = 5001
_counter = itertools.count()


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def _make_pki(directory: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "e2bfacade test internet CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in NAMES]
    sans += [x509.IPAddress(ipaddress.IPv4Address(a)) for a in ADDRESSES]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test internet")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "cert.pem").write_bytes(cert.public_bytes(pem))
    (directory / "key.pem").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


class TestInternet:
    """Make the namespace and its servers (a context manager); ``uplink`` and ``gateway``
    are what a runtime is given (``NetworkConfig(uplink=..., gateway=...)``)."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self) -> None:
        n = (os.getpid() * 7 + next(_counter)) % 250
        self.name = f"e2bt-inet-{os.getpid()}-{n}"
        self.uplink = f"e2bti{os.getpid() % 100000:05d}{n:02x}"[:15]
        self.host_ip = f"198.18.{n}.1"
        self.gateway = f"198.18.{n}.2"
        self.dir = Path(tempfile.mkdtemp(prefix="e2bt-inet-"))
        self.ca_path = self.dir / "ca.pem"
        self.server: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> TestInternet:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        _make_pki(self.dir)
        _run("ip", "netns", "add", self.name)
        _run("ip", "link", "add", self.uplink, "type", "veth", "peer", "name", "up0",
             "netns", self.name)  # fmt: skip
        _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.uplink)
        _run("ip", "link", "set", self.uplink, "up")
        inside = ("ip", "-n", self.name)
        _run(*inside, "addr", "add", f"{self.gateway}/30", "dev", "up0")
        _run(*inside, "link", "set", "up0", "up")
        _run(*inside, "link", "set", "lo", "up")
        for address in ADDRESSES:
            _run(*inside, "addr", "add", f"{address}/32", "dev", "lo")
        _run(*inside, "route", "add", "default", "via", self.host_ip)
        config = self.dir / "config.json"
        config.write_text(json.dumps({"dir": str(self.dir)}))
        repo = Path(__file__).resolve().parents[2]
        self.server = subprocess.Popen(
            ["ip", "netns", "exec", self.name, sys.executable, "-m", "tests.support.internet",
             "serve", str(config)],
            cwd=repo,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "server.log", "wb"),  # noqa: SIM115
        )  # fmt: skip
        server = self.server

        def ready() -> bool:
            if server.poll() is not None:
                raise RuntimeError("it exited")
            return (self.dir / "ready").exists()

        try:
            eventually(ready, within=20, what="the test internet's ready file")
        except (AssertionError, RuntimeError) as exc:
            raise RuntimeError(
                f"the test internet did not start ({exc}): "
                + (self.dir / "server.log").read_text(errors="replace")[-2000:]
            ) from None

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        subprocess.run(["ip", "link", "del", self.uplink], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        with contextlib.suppress(OSError):
            for path in self.dir.iterdir():
                path.unlink()
            self.dir.rmdir()


# ---------------------------------------------------------------------- inside the namespace
class _Web(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body are written apart: with Nagle's algorithm on, the body waited
    # for the client's delayed ACK (~40 ms), the floor of every kept-alive request.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        served_by = self.connection.getsockname()[0]
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
        if self.path == "/generate_204":
            status = 204
        elif self.path.startswith("/redirect/"):
            status = 307
        elif host == "1.1.1.1":
            status = 301
        elif host == "8.8.8.8":
            status = 302
        else:
            status = 200
        answer: dict[str, object] = {
            "served_by": served_by,
            "host": host,
            "path": self.path,
            "client": self.client_address[0],  # who connected: a SOCKS server, a NAT
        }
        if self.path.startswith("/headers"):
            answer["headers"] = [[k, v] for k, v in self.headers.items()]
            # What it got, in a form a relay that masks values cannot change: a test checks
            # a header arrived without the value travelling back to the guest.
            answer["sha256"] = {
                k.lower(): hashlib.sha256(v.encode()).hexdigest() for k, v in self.headers.items()
            }
            # And in full to a file of the host's (requests.jsonl in TestInternet.dir), for
            # a test that must read what arrived (a token to verify).
            with open(self.server.log_path, "a") as log:  # type: ignore[attr-defined]
                log.write(json.dumps({"path": self.path, "headers": answer["headers"]}) + "\n")
        body = b"" if status == 204 else json.dumps(answer).encode()
        self.send_response(status)
        if status in (301, 302):
            self.send_header("Location", "/moved")
        if status == 307:
            self.send_header("Location", self.path.removeprefix("/redirect/"))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_HEAD = _answer


class _Threaded(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def address_named(name: str) -> str | None:
    """The address of ``<a>-<b>-<c>-<d>.ip.example``, or None for another name."""
    label, _, rest = name.partition(".")
    try:
        return str(ipaddress.IPv4Address(label.replace("-", "."))) if rest == "ip.example" else None
    except ValueError:
        return None


def ip_name(address: str) -> str:
    """The test internet's name for ``address`` (:func:`address_named`'s inverse)."""
    return f"{address.replace('.', '-')}.ip.example"


def _dns_answer(wire: bytes) -> bytes | None:
    import dns.message
    import dns.rcode
    import dns.rrset

    try:
        query = dns.message.from_wire(wire)
    except Exception:  # noqa: BLE001 - anything unreadable is dropped
        return None
    reply = dns.message.make_response(query)
    for question in query.question:
        name = question.name.to_text().rstrip(".").lower()
        address = NAMES.get(name) or address_named(name)
        if address is None:
            reply.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == 1:  # A
            reply.answer.append(dns.rrset.from_text(question.name, 60, "IN", "A", address))
    return bytes(reply.to_wire())


def _dns_udp(address: str) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((address, 53))
    while True:
        wire, peer = s.recvfrom(4096)
        answer = _dns_answer(wire)
        if answer is not None:
            s.sendto(answer, peer)


def _dns_tcp(address: str) -> None:
    s = socket.create_server((address, 53), reuse_port=True)

    def one(conn: socket.socket) -> None:
        with conn:
            size = int.from_bytes(conn.recv(2), "big")
            answer = _dns_answer(conn.recv(size))
            if answer is not None:
                conn.sendall(len(answer).to_bytes(2, "big") + answer)

    while True:
        conn, _ = s.accept()
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def _sink() -> None:
    s = socket.create_server(("0.0.0.0", SINK_PORT), reuse_port=True)

    def drain(conn: socket.socket) -> None:
        with conn:
            while conn.recv(1 << 20):
                pass

    while True:
        conn, _ = s.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def serve(config_path: str) -> None:
    directory = Path(json.loads(Path(config_path).read_text())["dir"])
    threads = []
    _Threaded.log_path = directory / "requests.jsonl"  # type: ignore[attr-defined]
    web = _Threaded(("0.0.0.0", 80), _Web)
    threads.append(threading.Thread(target=web.serve_forever, daemon=True))
    tls = _Threaded(("0.0.0.0", 443), _Web)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    tls.socket = context.wrap_socket(tls.socket, server_side=True)
    threads.append(threading.Thread(target=tls.serve_forever, daemon=True))
    for address in DNS_SERVERS:
        threads.append(threading.Thread(target=_dns_udp, args=(address,), daemon=True))
        threads.append(threading.Thread(target=_dns_tcp, args=(address,), daemon=True))
    threads.append(threading.Thread(target=_sink, daemon=True))
    for thread in threads:
        thread.start()
    (directory / "ready").touch()
    for thread in threads:
        thread.join()


def hold() -> None:
    """``python -m tests.support.internet hold``: make a test internet, print what a server
    needs to use it (as shell exports), and keep it until interrupted (for benches and the
    referee run; see docs/compatibility.md, "Running the referee")."""
    import signal

    with TestInternet() as internet:
        print(f"export SANDBOX_UPLINK={internet.uplink}")
        print(f"export SANDBOX_UPLINK_GATEWAY={internet.gateway}")
        print("export SANDBOX_DNS_SERVERS=8.8.8.8")
        print(f"export SANDBOX_EXTRA_CA_CERTS={internet.ca_path}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(sys.argv[2])
elif __name__ == "__main__" and sys.argv[1:2] == ["hold"]:
    hold()
