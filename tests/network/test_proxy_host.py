"""The egress proxy dials from the host's network namespace, so whatever a guest makes it
dial must never be the host itself: not an address of the host on any interface (one the
host gained while the proxy ran included), whether a CIDR rule allows it or an allowed name
resolves to it. The kernel refuses a proxy socket's delivery to the host on its own too.
Every attack runs as guest root, against a listener on an address the test gives the host:
outside every never-reachable range, as a host's public address is."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2bfacade.runtime.local import LocalRuntime
from e2bfacade.runtime.local.net.egress import EgressProxy
from tests.network.conftest import curl, sh
from tests.support.internet import ip_name

WEB = "203.0.113.10"  # allowed.example


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def own_address() -> str:
    return f"198.51.100.{1 + os.getpid() % 254}"


@contextlib.contextmanager
def host_address() -> Iterator[str]:
    """An address the host has for a while: on a veth pair of its own in the host's
    namespace (in 198.51.100.0/24, which the test internet does not use)."""
    address = own_address()
    link = f"e2bth{os.getpid() % 100000:05d}"
    _run("ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p")
    try:
        _run("ip", "addr", "add", f"{address}/32", "dev", link)
        _run("ip", "link", "set", link, "up")
        yield address
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)


class Listener:
    """TCP services on ``address`` ports 80 and 443 (and 127.0.0.1, any port) that count
    who reached them and answer a secret."""

    def __init__(self, address: str) -> None:
        self.reached: list[tuple[str, int]] = []
        self.servers = [socket.create_server((address, port)) for port in (80, 443)]
        self.servers.append(socket.create_server(("127.0.0.1", 0)))
        self.loopback_port = self.servers[-1].getsockname()[1]
        for server in self.servers:
            threading.Thread(target=self._serve, args=(server,), daemon=True).start()

    def _serve(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            self.reached.append(server.getsockname()[:2])
            with contextlib.suppress(OSError):
                conn.sendall(b"host secret\n")
            conn.close()

    def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone would not)
            server.close()


@pytest.fixture
def host() -> Iterator[tuple[str, Listener]]:
    # Made after the module's egress proxy started: every test here is also about an
    # address the host gained while the proxy ran.
    with host_address() as address:
        listener = Listener(address)
        try:
            yield address, listener
        finally:
            listener.close()


def test_a_cidr_rule_naming_a_host_address_does_not_reach_the_host_through_the_proxy(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str], host: tuple[str, Listener]
) -> None:
    address, listener = host
    sid = make_sandbox(
        allow_internet=True,
        allow_out=("allowed.example", f"{address}/32"),
        deny_out=("0.0.0.0/0",),
    )
    # The proxy serves this sandbox (so the attempts below did go through it).
    assert curl(net_runtime, sid, "http://allowed.example/")[0] == 0
    # Port 80: no allowed name in the Host header, so the address is judged by the CIDRs.
    code, out = curl(net_runtime, sid, f"http://{address}/")
    assert code != 0 and "host secret" not in out, out
    # Port 443 with no TLS at all: nothing to match, judged by the CIDRs too.
    code, out = sh(
        net_runtime,
        sid,
        f"timeout 8 bash -c 'exec 3<>/dev/tcp/{address}/443; echo hello >&3; cat <&3'",
    )
    assert "host secret" not in out, out
    assert listener.reached == []


def test_an_allowed_name_that_resolves_to_a_host_address_does_not_reach_the_host(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str], host: tuple[str, Listener]
) -> None:
    address, listener = host
    name = ip_name(address)
    sid = make_sandbox(allow_internet=True, allow_out=(name,), deny_out=("0.0.0.0/0",))
    code, out = sh(net_runtime, sid, f"getent hosts {name}")
    assert out.split()[:1] == [address], out  # the name does resolve there
    for url in (f"http://{name}/", f"https://{name}/"):
        code, out = curl(net_runtime, sid, url, "-k")
        assert code != 0 and "host secret" not in out, (url, out)
    assert listener.reached == []


def test_the_proxy_refuses_to_dial_an_address_the_moment_the_host_has_it(
    net_runtime: LocalRuntime,
) -> None:
    proxy = EgressProxy(net_runtime.root)
    # Anything goes, but the never-reachable.
    record: dict[str, Any] = {"domains": [], "allow": [], "deny": []}
    address = own_address()
    try:
        assert proxy.decide(record, None, address) == address  # not the host's yet
        with host_address() as gained:
            assert gained == address
            assert proxy.decide(record, None, address) is None
            assert proxy.decide({**record, "allow": [f"{address}/32"]}, None, address) is None
        assert proxy.decide(record, None, address) == address  # and no longer once it is gone
        # Every other address of the host, on every interface (loopback's, the uplink's).
        for own in proxy.host.addresses():
            assert proxy.decide({**record, "allow": ["0.0.0.0/0"]}, None, str(own)) is None, own
    finally:
        proxy.host.close()


def test_the_kernel_never_delivers_a_proxy_socket_to_the_host(
    net_runtime: LocalRuntime, host: tuple[str, Listener]
) -> None:
    """What holds even if the proxy's own check were wrong: a socket with the proxy's mark
    leaves by the uplink or not at all."""
    address, listener = host
    network = net_runtime.network
    assert network is not None

    def dial(target: tuple[str, int]) -> str:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, network.mark)
            s.settimeout(5)
            try:
                s.connect(target)
            except OSError as exc:
                return type(exc).__name__
            return "connected"

    for target in ((address, 80), (address, 443), ("127.0.0.1", listener.loopback_port)):
        assert dial(target) == "ConnectionRefusedError", target
    assert listener.reached == []
    assert dial((WEB, 80)) == "connected"  # the mark's own way out still works
