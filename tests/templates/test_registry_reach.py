"""Where a pull may connect: with no mirror, only public addresses and what the operator
allows; never the host's loopback, its own addresses or private ranges, whether named by
the reference, by a name that resolves there, or by a redirect of an allowed registry. Every
refusal is one message, the same for a closed port and an open one, and no answer of a
refused target ever reaches the user."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from templates.builds.egress import Rules
from templates.builds.registry import PullFailed, pull
from tests.support.live_process import free_port

SECRET_BODY = "INTERNAL-ONLY-7d41c2 the host's own service answered"


def _host_address() -> str:
    """An address of this host's own that is not loopback (its outgoing interface's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.200", 9))  # no packet is sent: this only picks a route
        address: str = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this host has no address but loopback")
    return address


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1") -> Iterator[int]:
    server = ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _Secret(BaseHTTPRequestHandler):
    """A host-only service: answers anything with a body nobody outside may read (a 404,
    which skopeo quotes in its error)."""

    def do_GET(self) -> None:
        body = SECRET_BODY.encode()
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


def _redirecting_to(location: str) -> type[BaseHTTPRequestHandler]:
    class Redirect(BaseHTTPRequestHandler):
        """A registry (``/v2/`` answers) that sends every manifest request elsewhere."""

        def do_GET(self) -> None:
            if self.path == "/v2/":
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                return
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    return Redirect


def test_without_a_mirror_the_hosts_own_services_are_refused_with_one_message(
    pull_cache: Path,
) -> None:
    closed = free_port()
    own = _host_address()
    refs = [
        "127.0.0.1:5432/x",  # PostgreSQL, open
        "127.0.0.1:6379/x",  # Redis, open
        "127.0.0.1:3306/x",  # MariaDB, open
        f"127.0.0.1:{closed}/x",  # closed
        "localhost:5432/x",
        f"{own}:5432/x",  # the host's own address
    ]
    messages = {}
    for ref in refs:
        with pytest.raises(PullFailed) as caught:
            pull(ref, auth=None, mirror=None, cache_dir=pull_cache, team_id=1)
        messages[ref] = caught.value.message
    assert messages == {ref: f"the registry for {ref!r} is unreachable" for ref in refs}


def test_private_and_link_local_addresses_are_refused_without_a_connection_attempt(
    pull_cache: Path,
) -> None:
    # Nothing answers at these here: a pull that tried would wait for its timeout.
    for ref in ("10.255.255.1/x", "169.254.169.254/latest", "100.64.0.1:5000/x"):
        with pytest.raises(PullFailed) as caught:
            pull(ref, auth=None, mirror=None, cache_dir=pull_cache, team_id=1)
        assert caught.value.message == f"the registry for {ref!r} is unreachable"


@pytest.mark.parametrize("target", ["loopback", "own address"])
def test_a_registrys_redirect_to_the_host_is_not_followed_and_its_body_never_shows(
    target: str, pull_cache: Path
) -> None:
    host = "127.0.0.1" if target == "loopback" else _host_address()
    with _serving(_Secret, host="0.0.0.0") as secret_port:
        location = f"http://{host}:{secret_port}/internal"
        with _serving(_redirecting_to(location)) as registry_port:
            with pytest.raises(PullFailed) as caught:
                pull(
                    "team/app:1",
                    auth=None,
                    mirror=f"http://127.0.0.1:{registry_port}",
                    cache_dir=pull_cache,
                    team_id=1,
                )
    assert SECRET_BODY not in caught.value.message
    assert "INTERNAL-ONLY" not in caught.value.message
    assert caught.value.message == "the registry for 'team/app:1' is unreachable"


def test_an_address_the_operator_allows_is_reached(registry_url: str, pull_cache: Path) -> None:
    port = registry_url.rsplit(":", 1)[1]
    ref = f"127.0.0.1:{port}/library/debian:bookworm"
    with pytest.raises(PullFailed) as refused:
        pull(ref, auth=None, mirror=None, cache_dir=pull_cache, team_id=1)
    assert refused.value.message == f"the registry for {ref!r} is unreachable"
    # Allowed, it is reached: the registry answers (in plain HTTP, which a pull without a
    # mirror does not speak).
    with pytest.raises(PullFailed) as reached:
        pull(ref, auth=None, mirror=None, cache_dir=pull_cache, team_id=1, allow=["127.0.0.1/32"])
    assert (
        reached.value.message == f"the registry serves plain HTTP: cannot pull {ref!r} over HTTPS"
    )


def test_an_allowance_that_is_not_a_network_or_a_host_name_is_refused() -> None:
    assert Rules.of(mirror=None, allow=["10.1.0.0/16", "registry.internal", "::1"]).names == {
        "registry.internal"
    }
    with pytest.raises(ValueError):
        Rules.of(mirror=None, allow=["http://registry.internal/"])
