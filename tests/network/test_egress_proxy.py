"""E2B's ``egressProxy``: a sandbox's outbound TCP goes out through the user's SOCKS5
server (Debian's dante, on the suite's test internet: tests/support/socks.py), after its
allow/deny rules, the sandbox unaware; flows matched by a domain are requested by name
(remote DNS); RFC 1929 credentials are kept encrypted and never echoed. Through the
unmodified Python SDK against a live server whose uplink is the test internet, on each
driver (``[local]``, ``[gvisor]``: the divert of every port starts in gVisor's netstack
there)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import ALL_TRAFFIC, CommandExitException, Sandbox, Secret

from tests.network.conftest import LIVE_DRIVERS, assert_runs_on, live_driver_env, unique_cidr
from tests.support.internet import TestInternet
from tests.support.live_fixtures import point_sdk
from tests.support.live_server import REPO, LiveServer, live_server
from tests.support.socks import ONLY_HERE, Dante

SOCKS = "203.0.113.40"
USER, PASSWORD = "socks-user", "socks-pass-5e7d1c-never-echoed"


@pytest.fixture(scope="module", params=LIVE_DRIVERS)
def proxy_server(request: pytest.FixtureRequest, internet: TestInternet) -> Iterator[LiveServer]:
    suite_url = os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"
    env = {
        **live_driver_env(request.param),
        "SANDBOX_UPLINK": internet.uplink,
        "SANDBOX_UPLINK_GATEWAY": internet.gateway,
        "SANDBOX_NETWORK_CIDR": unique_cidr(),
        "SANDBOX_EGRESS_PORT": "auto",
        "SANDBOX_DNS_SERVERS": "8.8.8.8",
        "SANDBOX_EXTRA_CA_CERTS": str(internet.ca_path),
        # The SOCKS server's address is on the test internet's own documentation range,
        # which the default never-reachable list does not hold.
    }
    with live_server(suite_url, extra_env=env) as server:
        yield server


@pytest.fixture(scope="module")
def socks(internet: TestInternet) -> Iterator[Dante]:
    with Dante(internet, SOCKS, user=USER, password=PASSWORD) as server:
        yield server


@pytest.fixture
def sdk(proxy_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    point_sdk(monkeypatch, proxy_server, proxy_server.api_key)
    return proxy_server


def fetch(sbx: Sandbox, url: str, *extra: str) -> dict[str, Any]:
    command = f"curl -sS --connect-timeout 3 --max-time 8 {' '.join(extra)} {url}"
    try:
        out = sbx.commands.run(command, user="root")
    except CommandExitException as exc:
        return {"error": exc.stderr}
    answer: dict[str, Any] = json.loads(out.stdout)
    return answer


def test_outbound_tcp_goes_out_through_the_socks_server_with_its_credentials(
    sdk: LiveServer, socks: Dante
) -> None:
    sbx = Sandbox.create(
        network={
            "allow_out": ["allowed.example", ONLY_HERE[0], "203.0.113.30"],
            "deny_out": [ALL_TRAFFIC],
            "egress_proxy": {"address": f"{SOCKS}:1080", "username": USER, "password": PASSWORD},
        }
    )
    try:
        cmdline = sbx.commands.run("cat /proc/cmdline", user="root").stdout
        assert_runs_on(sdk.env["SANDBOX_RUNTIME"], cmdline)
        # A name only the SOCKS server can resolve: sent to it as a name (ATYP domain).
        remote = fetch(
            sbx, f"http://{ONLY_HERE[0]}/headers", f"--resolve {ONLY_HERE[0]}:80:1.1.1.1"
        )
        assert remote.get("client") == SOCKS, remote
        assert remote["served_by"] == ONLY_HERE[1]
        # A domain-matched flow: requested by name, resolved by the SOCKS server.
        by_name = fetch(sbx, "http://allowed.example/headers")
        assert by_name["client"] == SOCKS, by_name
        assert by_name["served_by"] == "203.0.113.10"
        # An address the rules allow.
        by_address = fetch(sbx, "http://203.0.113.30/")
        assert by_address["client"] == SOCKS, by_address
        # HTTPS by name too (relayed untouched: no rule).
        assert fetch(sbx, "https://allowed.example/")["client"] == SOCKS
        # What the rules deny is refused before any tunnel.
        assert "error" in fetch(sbx, "http://203.0.113.20/")
        assert f"username%{USER}@" in socks.log_text()  # RFC 1929, as the user given
        # The API shows the proxy without its password; the sandbox sees none of it.
        shown = httpx.get(
            f"{sdk.url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-Key": sdk.api_key}
        ).json()["network"]["egressProxy"]
        assert shown == {"address": f"{SOCKS}:1080", "username": USER}
        env = sbx.commands.run("env", user="root").stdout
        assert PASSWORD not in env and SOCKS not in env
    finally:
        sbx.kill()


def test_wrong_credentials_get_no_connection(sdk: LiveServer, socks: Dante) -> None:
    sbx = Sandbox.create(
        network={
            "allow_out": ["allowed.example"],
            "deny_out": [ALL_TRAFFIC],
            "egress_proxy": {"address": f"{SOCKS}:1080", "username": USER, "password": "wrong"},
        }
    )
    try:
        assert "error" in fetch(sbx, "http://allowed.example/")
    finally:
        sbx.kill()


def test_a_secret_rule_and_the_socks_server_together(sdk: LiveServer, socks: Dante) -> None:
    Secret.create("socks-rule-key", "sk-through-socks")
    sbx = Sandbox.create(
        network={
            "allow_out": ["allowed.example"],
            "deny_out": [ALL_TRAFFIC],
            "rules": {
                "allowed.example": [
                    {"transform": {"headers": {"X-Key": Secret.fill("socks-rule-key")}}}
                ]
            },
            "egress_proxy": {"address": f"{SOCKS}:1080", "username": USER, "password": PASSWORD},
        }
    )
    try:
        answer = fetch(sbx, "https://allowed.example/headers")
        assert answer["client"] == SOCKS
        assert "x-key" in answer["sha256"]
    finally:
        sbx.kill()
        Secret.destroy("socks-rule-key")
