"""Where the unmodified Python SDK (e2b==2.63.0) would send a sandbox's data-plane traffic —
its ``X-Access-Token``, the user's commands and files. Without ``E2B_SANDBOX_URL`` (the
``sdk_env`` fixture unsets it, and ``E2B_DOMAIN``) it builds the envd URL from the
``domain`` of the create/connect answer; a null domain would make that ``e2b.app``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
from e2b import AsyncSandbox, Sandbox

from tests.support.live_server import LiveServer

E2B_HOSTS = ("e2b.app", "e2b.dev", "e2b.pro")


def assert_stays_off_e2b(sandbox: Sandbox | AsyncSandbox, http: httpx.Client) -> None:
    # The server's SANDBOX_DOMAIN: localhost unless the environment (or a .env) says otherwise.
    domain = http.get(f"/sandboxes/{sandbox.sandbox_id}").json()["domain"]
    assert isinstance(domain, str) and domain
    urls = [sandbox.envd_api_url, sandbox.envd_direct_url, sandbox.get_host(49983)]
    for url in urls:
        assert not any(host in url for host in E2B_HOSTS), url
    assert sandbox.sandbox_domain == domain
    assert sandbox.envd_api_url == f"https://49983-{sandbox.sandbox_id}.{domain}"


def test_the_sdk_builds_the_envd_url_from_the_servers_domain_never_e2bs(
    make_sandbox: Callable[..., Sandbox], http: httpx.Client
) -> None:
    created = make_sandbox()
    assert_stays_off_e2b(created, http)

    connected = Sandbox.connect(created.sandbox_id)
    assert_stays_off_e2b(connected, http)

    assert created.get_info().sandbox_domain == created.sandbox_domain


def test_the_async_sdk_builds_the_envd_url_from_the_servers_domain_never_e2bs(
    sdk_env: LiveServer, kill_later: Callable[[str], str], http: httpx.Client
) -> None:
    async def scenario() -> None:
        created = await AsyncSandbox.create(timeout=60)
        kill_later(created.sandbox_id)
        assert_stays_off_e2b(created, http)

        connected = await AsyncSandbox.connect(created.sandbox_id)
        assert_stays_off_e2b(connected, http)

    asyncio.run(scenario())
