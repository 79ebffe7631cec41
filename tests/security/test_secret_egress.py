"""A secret a transform rule names reaches the rule's destination, written into the
sandbox's requests by the egress proxy, and nothing else: not the sandbox (its
environment, its files, its processes, what the proxy relays back), not another domain
(a redirect, a second request on the same connection, a name the guest points at an
address of its choosing, a CONNECT through the proxy). Through the unmodified Python SDK
against a live server whose uplink is the suite's test internet, whose web servers answer
``/headers`` with every header they got and its SHA-256 (tests/support/internet.py). Each
test runs on both drivers (``[local]``, ``[gvisor]``): the proxy is the host's either way,
but the guest's requests, its trust store and the divert start in a different network
stack."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from e2b import ALL_TRAFFIC, CommandExitException, Sandbox, SandboxException, Secret

from tests.network.conftest import (  # noqa: F401 - fixture
    LIVE_DRIVERS,
    assert_runs_on,
    internet,
    live_driver_env,
    unique_cidr,
)
from tests.support.internet import TestInternet
from tests.support.live_fixtures import point_sdk
from tests.support.live_server import REPO, LiveServer, live_server

VALUE = "sk-egress-7c2e41d9b0a5f3e8-never-in-the-sandbox"
VALUE_2 = "sk-egress-rotated-51f0c6a2d8e4-never-in-the-sandbox"
RULE_HOST = "allowed.example"  # 203.0.113.10 on the test internet
RULE_ADDRESS = "203.0.113.10"
OTHER_HOST = "other.example"  # 203.0.113.30
OTHER_ADDRESS = "203.0.113.30"


@pytest.fixture(scope="module", params=LIVE_DRIVERS)
def egress_server(
    request: pytest.FixtureRequest,
    internet: TestInternet,  # noqa: F811
) -> Iterator[LiveServer]:
    suite_url = os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"
    env = {
        **live_driver_env(request.param),
        "SANDBOX_UPLINK": internet.uplink,
        "SANDBOX_UPLINK_GATEWAY": internet.gateway,
        "SANDBOX_NETWORK_CIDR": unique_cidr(),
        "SANDBOX_EGRESS_PORT": "auto",
        "SANDBOX_DNS_SERVERS": "8.8.8.8",
        # The proxy verifies a rule's destination against it; sandboxes trust it too.
        "SANDBOX_EXTRA_CA_CERTS": str(internet.ca_path),
    }
    with live_server(suite_url, extra_env=env) as server:
        yield server


@pytest.fixture
def sdk(egress_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    point_sdk(monkeypatch, egress_server, egress_server.api_key)
    return egress_server


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def run(sbx: Sandbox, command: str) -> str:
    try:
        return str(sbx.commands.run(command, user="root", timeout=30).stdout)
    except CommandExitException as exc:
        return str(exc.stdout + exc.stderr)


def fetch(sbx: Sandbox, url: str, *extra: str) -> dict[str, Any]:
    out = run(sbx, f"curl -sS --connect-timeout 3 --max-time 8 {' '.join(extra)} {url}")
    answer: dict[str, Any] = json.loads(out)
    return answer


def headers_of(answer: dict[str, Any]) -> dict[str, str]:
    return {k.lower(): v for k, v in answer.get("headers", [])}


def rules(secret: str) -> dict[str, Any]:
    return {
        RULE_HOST: [
            {"transform": {"headers": {"Authorization": f"Bearer {Secret.fill(secret)}"}}},
            {"transform": {"headers": {"X-Team": "static"}}},
        ]
    }


@pytest.fixture
def secret_name(sdk: LiveServer) -> Iterator[str]:
    name = f"egress-{uuid.uuid4().hex[:8]}"
    Secret.create(name, VALUE)
    yield name
    Secret.destroy(name)


@pytest.fixture
def sandbox(sdk: LiveServer, secret_name: str) -> Iterator[Sandbox]:
    sbx = Sandbox.create(
        network={
            "allow_out": [RULE_HOST, OTHER_HOST],
            "deny_out": [ALL_TRAFFIC],
            "rules": rules(secret_name),
        },
    )
    assert_runs_on(sdk.env["SANDBOX_RUNTIME"], run(sbx, "cat /proc/cmdline"))
    yield sbx
    sbx.kill()


def test_a_rule_writes_the_secret_into_http_requests_to_its_domain_only(
    sandbox: Sandbox, secret_name: str
) -> None:
    answer = fetch(sandbox, f"http://{RULE_HOST}/headers", "-H 'Authorization: Bearer mine'")
    # The destination got the secret (its digest), replacing the sandbox's own header...
    assert answer["served_by"] == RULE_ADDRESS
    assert answer["sha256"]["authorization"] == digest(f"Bearer {VALUE}")
    assert headers_of(answer)["x-team"] == "static"
    # ...and what came back to the sandbox has it masked.
    assert headers_of(answer)["authorization"] == "Bearer " + "*" * len(VALUE)
    # Another domain gets nothing of the rule, nor does a redirect from the rule's domain.
    assert "authorization" not in fetch(sandbox, f"http://{OTHER_HOST}/headers")["sha256"]
    redirected = fetch(sandbox, f"http://{RULE_HOST}/redirect/http://{OTHER_HOST}/headers", "-L")
    assert redirected["served_by"] == OTHER_ADDRESS
    assert "authorization" not in redirected["sha256"]


def test_the_sandbox_cannot_read_the_secret_from_its_environment_files_or_processes(
    sandbox: Sandbox, secret_name: str
) -> None:
    fetch(sandbox, f"http://{RULE_HOST}/headers")  # the proxy has resolved it at least once
    # A pattern that matches the value without holding it (the grep's own command line is
    # in /proc too).
    pattern = VALUE[:12] + "[" + VALUE[12] + "]" + VALUE[13:]
    found = run(
        sandbox,
        f"env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | "
        f"grep -c -- '{pattern}'; "
        f"grep -rIl -- '{pattern}' /etc /root /home /tmp /run /var 2>/dev/null; "
        f"getent hosts {RULE_HOST}; echo done",
    )
    assert found.endswith("done\n"), found
    assert VALUE not in found
    assert "\n0\n" in found  # no process's environment or command line holds it
    assert secret_name not in run(sandbox, "env")


def test_a_name_pointed_at_an_address_the_guest_chose_is_dialled_where_the_name_resolves(
    sandbox: Sandbox,
) -> None:
    # As a DNS rebinding or an /etc/hosts entry would: the rule's name, another address.
    answer = fetch(
        sandbox,
        f"http://{RULE_HOST}/headers",
        f"--resolve {RULE_HOST}:80:{OTHER_ADDRESS}",
    )
    assert answer["served_by"] == RULE_ADDRESS  # never the address the guest picked
    # The guest's own address with the rule's Host header: the same.
    assert (
        fetch(sandbox, f"http://{OTHER_ADDRESS}/headers", f"-H 'Host: {RULE_HOST}'")["served_by"]
        == RULE_ADDRESS
    )


def test_a_second_request_for_another_host_on_the_connection_is_not_forwarded(
    sandbox: Sandbox,
) -> None:
    two = (
        f"GET /headers HTTP/1.1\\r\\nHost: {RULE_HOST}\\r\\n\\r\\n"
        f"GET /headers HTTP/1.1\\r\\nHost: {OTHER_HOST}\\r\\n\\r\\n"
    )
    out = run(
        sandbox,
        f"bash -c 'exec 3<>/dev/tcp/{RULE_HOST}/80; printf \"{two}\" >&3; timeout 5 cat <&3'",
    )
    assert out.count('"served_by"') == 1, out
    assert f'"host": "{OTHER_HOST}"' not in out
    # A CONNECT through the rule's domain tunnels nowhere else either.
    tunnelled = run(
        sandbox,
        f"curl -sS --max-time 5 -p -x http://{RULE_HOST}:80 http://{OTHER_HOST}/headers",
    )
    assert f'"served_by": "{OTHER_ADDRESS}"' not in tunnelled


def test_a_new_version_applies_to_the_next_request_and_a_revoked_secret_sends_no_header(
    sandbox: Sandbox, secret_name: str
) -> None:
    Secret.update(secret_name, VALUE_2)
    answer = fetch(sandbox, f"http://{RULE_HOST}/headers")
    assert answer["sha256"]["authorization"] == digest(f"Bearer {VALUE_2}")
    Secret.destroy(secret_name)
    answer = fetch(sandbox, f"http://{RULE_HOST}/headers", "-H 'Authorization: Bearer mine'")
    # Dropped: neither the placeholder (which names the secret) nor the sandbox's own.
    assert "authorization" not in headers_of(answer)
    assert headers_of(answer)["x-team"] == "static"
    Secret.create(secret_name, VALUE)  # for the fixture's teardown


def test_rules_naming_an_unknown_secret_are_refused_naming_it(sdk: LiveServer) -> None:
    missing = f"missing-{uuid.uuid4().hex[:6]}"
    network: Any = {"allow_out": [RULE_HOST], "deny_out": [ALL_TRAFFIC], "rules": rules(missing)}
    with pytest.raises(SandboxException, match=f"unknown secrets: {missing}"):
        Sandbox.create(network=network)
    sbx = Sandbox.create(network={"allow_out": [RULE_HOST], "deny_out": [ALL_TRAFFIC]})
    try:
        with pytest.raises(SandboxException, match=f"unknown secrets: {missing}"):
            sbx.update_network(network)
    finally:
        sbx.kill()


def issuer(sbx: Sandbox, url: str) -> str:
    out = run(sbx, f"curl -sv --max-time 8 -o /dev/null {url} 2>&1 | grep -i 'issuer:'")
    return out.strip()


def test_a_rule_writes_the_secret_into_https_requests_through_a_certificate_the_sandbox_trusts(
    sandbox: Sandbox,
) -> None:
    answer = fetch(sandbox, f"https://{RULE_HOST}/headers", "-H 'Authorization: Bearer mine'")
    assert answer["served_by"] == RULE_ADDRESS
    assert answer["sha256"]["authorization"] == digest(f"Bearer {VALUE}")
    assert headers_of(answer)["authorization"] == "Bearer " + "*" * len(VALUE)
    # HTTP/2 offered: the proxy answers HTTP/1.1, and the rule still applies.
    h2 = fetch(sandbox, f"https://{RULE_HOST}/headers", "--http2")
    assert h2["sha256"]["authorization"] == digest(f"Bearer {VALUE}")
    # The rule's domain is intercepted (the proxy's CA), no other is (the server's own).
    assert "e2bfacade egress proxy CA" in issuer(sandbox, f"https://{RULE_HOST}/")
    assert "test internet CA" in issuer(sandbox, f"https://{OTHER_HOST}/")
    assert "authorization" not in fetch(sandbox, f"https://{OTHER_HOST}/headers")["sha256"]
    # The usual TLS stacks are pointed at a bundle that holds the proxy's CA.
    env = run(sandbox, "env")
    assert "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/e2bfacade-egress-ca.pem" in env
    assert "REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt" in env
    python = run(
        sandbox,
        'python3 -c "import json, urllib.request; '
        f"print(json.load(urllib.request.urlopen('https://{RULE_HOST}/headers'))['sha256']"
        "['authorization'])\" 2>&1 || echo no-python",
    ).strip()
    assert python in (digest(f"Bearer {VALUE}"), "no-python"), python


def test_a_rule_destination_that_fails_verification_gets_no_request(sdk: LiveServer) -> None:
    # The test internet's certificate does not name 203-0-113-10.ip.example.
    name = f"verify-{uuid.uuid4().hex[:8]}"
    Secret.create(name, VALUE)
    host = "203-0-113-10.ip.example"
    headers = {"Authorization": Secret.fill(name)}
    sbx = Sandbox.create(
        network={
            "allow_out": [host],
            "deny_out": [ALL_TRAFFIC],
            "rules": {host: [{"transform": {"headers": headers}}]},
        }
    )
    try:
        out = run(sbx, f"curl -sS --max-time 8 https://{host}/headers; echo exit=$?")
        assert "exit=0" not in out and "served_by" not in out, out
    finally:
        sbx.kill()
        Secret.destroy(name)


# ------------------------------------------------------------------- workload identity
def b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def arrived(internet: TestInternet, marker: str) -> dict[str, str]:  # noqa: F811
    """The headers of the last request the test internet logged for path ``marker``."""
    lines = (internet.dir / "requests.jsonl").read_text().splitlines()
    entry = [json.loads(line) for line in lines if marker in line][-1]
    return {k.lower(): v for k, v in entry["headers"]}


def verify(token: str, jwks: dict[str, Any]) -> dict[str, Any]:
    """The claims of an ES256 JWT, its signature checked against ``jwks``."""
    head, body, signature = token.split(".")
    header = json.loads(b64decode(head))
    assert header["alg"] == "ES256"
    (jwk,) = [k for k in jwks["keys"] if k["kid"] == header["kid"]]
    public = ec.EllipticCurvePublicNumbers(
        int.from_bytes(b64decode(jwk["x"]), "big"),
        int.from_bytes(b64decode(jwk["y"]), "big"),
        ec.SECP256R1(),
    ).public_key()
    raw = b64decode(signature)
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    public.verify(der, f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256()))
    claims: dict[str, Any] = json.loads(b64decode(body))
    return claims


def test_a_workload_token_is_minted_per_request_and_verifies_against_the_issuers_jwks(
    sdk: LiveServer,
    internet: TestInternet,  # noqa: F811
) -> None:
    iam: Any = {
        "tokens": {"aws": Secret.iam_token(audience="sts.amazonaws.com", token_type="JWT-SVID")}
    }
    sbx = Sandbox.create(
        network={
            "allow_out": [RULE_HOST],
            "deny_out": [ALL_TRAFFIC],
            "rules": {
                RULE_HOST: [
                    {
                        "transform": lambda ctx: {
                            "headers": {"Authorization": f"Bearer {ctx.iam.tokens['aws']}"}
                        }
                    }
                ]
            },
        },
        iam=iam,
    )
    try:
        echoed = fetch(sbx, f"https://{RULE_HOST}/headers?identity-1")
        token = arrived(internet, "identity-1")["authorization"].removeprefix("Bearer ")
        # The sandbox got it masked; the destination got a token it can verify.
        assert token not in json.dumps(echoed)
        discovery = httpx.get(f"{sdk.url}/.well-known/openid-configuration").json()
        assert discovery["issuer"] == sdk.url
        jwks = httpx.get(discovery["jwks_uri"]).json()
        claims = verify(token, jwks)
        assert claims["iss"] == sdk.url
        assert claims["aud"] == "sts.amazonaws.com"
        assert claims["sub"].endswith(f":sandbox:{sbx.sandbox_id}")
        assert claims["sub"].startswith("team:")
        assert 0 < claims["exp"] - time.time() <= 300
        # A fresh one for each request.
        fetch(sbx, f"https://{RULE_HOST}/headers?identity-2")
        again = arrived(internet, "identity-2")["authorization"].removeprefix("Bearer ")
        assert again != token and verify(again, jwks)["jti"] != claims["jti"]
        # Not in the sandbox's environment or files either.
        assert token not in run(sbx, "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
    finally:
        sbx.kill()


def test_a_rule_naming_an_undeclared_workload_token_is_refused(sdk: LiveServer) -> None:
    network: Any = {
        "allow_out": [RULE_HOST],
        "deny_out": [ALL_TRAFFIC],
        "rules": {RULE_HOST: [{"transform": {"headers": {"A": "${e2b.identity.tokens.gcp}"}}}]},
    }
    with pytest.raises(SandboxException, match="does not declare: gcp"):
        Sandbox.create(network=network)
