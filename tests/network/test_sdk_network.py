"""Networking through the unmodified SDKs against a live server whose uplink is the suite's
test internet: what a default create reaches, allow_internet_access, network rules and
update_network, validation as E2B answers it, and allowPublicTraffic's traffic token."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from e2b import ALL_TRAFFIC, CommandExitException, Sandbox, SandboxException

from tests.network.conftest import unique_cidr
from tests.support.internet import TestInternet
from tests.support.live_fixtures import point_sdk
from tests.support.live_server import REPO, LiveServer, live_server
from tests.support.node_support import run_sdk_script
from tests.support.waiting import eventually

WEB = "http://203.0.113.10/"
JS_DIR = REPO / "tests" / "contract" / "js"


@pytest.fixture(scope="module")
def net_server(internet: TestInternet) -> Iterator[LiveServer]:
    suite_url = os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"
    env = {
        "SANDBOX_UPLINK": internet.uplink,
        "SANDBOX_UPLINK_GATEWAY": internet.gateway,
        "SANDBOX_NETWORK_CIDR": unique_cidr(),
        "SANDBOX_EGRESS_PORT": "auto",  # a fixed pick may be an ephemeral port in use
        "SANDBOX_DNS_SERVERS": "8.8.8.8",
    }
    with live_server(suite_url, extra_env=env) as server:
        yield server


@pytest.fixture
def sdk(net_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    point_sdk(monkeypatch, net_server, net_server.api_key)
    return net_server


def reaches(sbx: Sandbox, url: str) -> bool:
    try:
        sbx.commands.run(f"curl -sS --connect-timeout 3 --max-time 8 {url}")
    except CommandExitException:
        return False
    return True


def test_a_default_create_reaches_the_internet(sdk: LiveServer) -> None:
    sbx = Sandbox.create()
    try:
        assert reaches(sbx, WEB)
        assert reaches(sbx, "http://other.example/")  # DNS inside the guest
        assert sbx.get_info().allow_internet_access is True
    finally:
        sbx.kill()


def test_allow_internet_access_false_is_isolated(sdk: LiveServer) -> None:
    sbx = Sandbox.create(allow_internet_access=False)
    try:
        assert not reaches(sbx, WEB)
    finally:
        sbx.kill()


def test_network_rules_and_live_updates(sdk: LiveServer) -> None:
    sbx = Sandbox.create(network={"deny_out": [ALL_TRAFFIC], "allow_out": ["1.1.1.1"]})
    try:
        assert reaches(sbx, "http://1.1.1.1/") and not reaches(sbx, "http://8.8.8.8/")
        info = sbx.get_info()
        assert info.network is not None
        sbx.update_network({"deny_out": ["8.8.8.8"]})
        assert reaches(sbx, "http://1.1.1.1/") and not reaches(sbx, "http://8.8.8.8/")
        assert reaches(sbx, WEB)
        sbx.update_network({})  # replaces every rule: nothing is denied
        assert reaches(sbx, "http://8.8.8.8/")
        sbx.update_network({"allow_internet_access": False})
        assert not reaches(sbx, WEB)
    finally:
        sbx.kill()


def test_domains_through_the_sdk(sdk: LiveServer) -> None:
    sbx = Sandbox.create(network={"deny_out": [ALL_TRAFFIC], "allow_out": ["allowed.example"]})
    try:
        assert reaches(sbx, "http://allowed.example/")
        assert not reaches(sbx, "http://denied.example/")
    finally:
        sbx.kill()


def test_rules_are_validated_as_e2b_does(sdk: LiveServer) -> None:
    cases = [
        ({"deny_out": ["example.com"]}, "invalid denied CIDR example.com"),
        ({"allow_out": ["example.com"]}, "must include 'ALL_TRAFFIC' in deny out"),
        ({"deny_out": ["10.0.0.0/33"]}, "invalid denied CIDR"),
        ({"allow_out": ["fd00::/8"]}, "IPv6 is not supported"),
        ({"dns_servers": ["not-an-ip"]}, "invalid DNS server"),
    ]
    for network, message in cases:
        with pytest.raises(SandboxException) as caught:
            Sandbox.create(network=network)  # type: ignore[arg-type]
        assert message in str(caught.value), (network, caught.value)
    sbx = Sandbox.create()
    try:
        with pytest.raises(SandboxException) as caught:
            sbx.update_network({"deny_out": ["nope"]})
        assert "invalid denied CIDR nope" in str(caught.value)
        assert reaches(sbx, WEB)  # a refused update changed nothing
    finally:
        sbx.kill()


def test_allow_public_traffic_false_needs_the_traffic_token(sdk: LiveServer) -> None:
    sbx = Sandbox.create(network={"allow_public_traffic": False})
    try:
        token = sbx.traffic_access_token
        assert token
        sbx.commands.run("python3 -m http.server 8080", background=True)
        url = f"{sdk.sandbox_url}/"
        base = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8080"}
        got = httpx.get(url, headers=base, timeout=10)
        assert got.status_code == 403
        assert "Token header 'e2b-traffic-access-token' is missing" in got.json()["message"]
        got = httpx.get(url, headers={**base, "e2b-traffic-access-token": "wrong"}, timeout=10)
        assert got.status_code == 403 and "is invalid" in got.json()["message"]
        eventually(
            lambda: httpx.get(url, headers={**base, "e2b-traffic-access-token": token}, timeout=10),
            until=lambda got: got.status_code == 200,
            within=15,
            every=0.2,
            what="the guest's server answering with the token",
        )
        # envd's own port is exempt: the SDK's calls work without the traffic token.
        assert sbx.commands.run("echo ok").stdout == "ok\n"
    finally:
        sbx.kill()
    public = Sandbox.create()
    try:
        assert public.traffic_access_token is None
    finally:
        public.kill()


def test_js_sdk_network(net_server: LiveServer) -> None:
    run_sdk_script(
        JS_DIR,
        "network.mjs",
        {
            "E2B_API_URL": net_server.url,
            "E2B_SANDBOX_URL": net_server.sandbox_url,
            "E2B_API_KEY": net_server.api_key,
        },
    )


def test_update_network_repeated_and_concurrent(sdk: LiveServer) -> None:
    """The retry table's row: the same PUT 5 times, and two different ones at once, each
    answer 204; the rules are the last committed body's, in the database and the guest."""
    from concurrent.futures import ThreadPoolExecutor

    sbx = Sandbox.create()
    try:
        url = f"{sdk.url}/sandboxes/{sbx.sandbox_id}/network"
        headers = {"X-API-Key": sdk.api_key}
        deny = {"denyOut": ["8.8.8.8"]}
        for _ in range(5):
            assert httpx.put(url, json=deny, headers=headers, timeout=30).status_code == 204
        assert not reaches(sbx, "http://8.8.8.8/") and reaches(sbx, "http://1.1.1.1/")
        bodies = [{"denyOut": ["1.1.1.1"]}, {"denyOut": ["8.8.8.8"]}] * 3
        with ThreadPoolExecutor(4) as pool:
            codes = list(
                pool.map(
                    lambda b: httpx.put(url, json=b, headers=headers, timeout=30).status_code,
                    bodies,
                )
            )
        assert codes == [204] * len(bodies)
        detail = httpx.get(f"{sdk.url}/sandboxes/{sbx.sandbox_id}", headers=headers).json()
        denied = detail["network"].get("denyOut") or []
        assert detail["network"]["allowPublicTraffic"] is True
        assert denied in (["1.1.1.1"], ["8.8.8.8"])
        # The guest follows what is stored, whichever body won.
        assert not reaches(sbx, f"http://{denied[0]}/")
        other = "8.8.8.8" if denied == ["1.1.1.1"] else "1.1.1.1"
        assert reaches(sbx, f"http://{other}/")
        missing = httpx.put(f"{sdk.url}/sandboxes/nope/network", json={}, headers=headers)
        assert missing.status_code == 404
    finally:
        sbx.kill()
