"""Every sandbox answer carries ``domain``, and never null nor one of E2B's: without
``E2B_SANDBOX_URL`` the SDKs send a sandbox's data-plane traffic (its access token, the
user's commands and files) to ``https://<port>-<sandboxID>.<domain>``, and with a null
domain (and no ``E2B_DOMAIN``) to e2b.app, E2B's cloud."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework.test import APIClient

CreateSandbox = Callable[..., dict[str, Any]]
E2B_DOMAINS = ("e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev", "e2b-tango.dev")


def assert_local_domain(body: dict[str, Any], expected: str) -> None:
    domain = body["domain"]
    assert isinstance(domain, str) and domain == expected
    assert not any(domain == d or domain.endswith("." + d) for d in E2B_DOMAINS)


def test_create_on_v1_and_v2_answers_the_configured_domain_never_null(
    api_client: APIClient, settings: Any
) -> None:
    v2 = api_client.post("/v2/sandboxes", {"templateID": "base", "timeout": 60}, format="json")
    v1 = api_client.post("/sandboxes", {"templateID": "base"}, format="json")

    assert v2.status_code == v1.status_code == 201
    # localhost unless configured (tests/test_secrets.py checks the default, free of any .env)
    assert_local_domain(v2.json(), settings.SANDBOX_DOMAIN)
    assert_local_domain(v1.json(), settings.SANDBOX_DOMAIN)


def test_connect_resume_get_and_fork_answer_the_configured_domain(
    api_client: APIClient, create_sandbox: CreateSandbox, settings: Any
) -> None:
    settings.SANDBOX_DOMAIN = "sandboxes.example.test:8443"
    sandbox_id = create_sandbox(timeout=60)["sandboxID"]

    running = api_client.post(f"/v2/sandboxes/{sandbox_id}/connect", {"timeout": 60}, "json")
    assert running.status_code == 200
    assert_local_domain(running.json(), "sandboxes.example.test:8443")

    detail = api_client.get(f"/sandboxes/{sandbox_id}")
    assert detail.status_code == 200
    assert_local_domain(detail.json(), "sandboxes.example.test:8443")

    assert api_client.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
    resumed = api_client.post(f"/sandboxes/{sandbox_id}/resume", {"timeout": 60}, "json")
    assert resumed.status_code == 201
    assert_local_domain(resumed.json(), "sandboxes.example.test:8443")

    assert api_client.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
    connected = api_client.post(f"/v2/sandboxes/{sandbox_id}/connect", {"timeout": 60}, "json")
    assert connected.status_code == 201
    assert_local_domain(connected.json(), "sandboxes.example.test:8443")

    forks = api_client.post(f"/sandboxes/{sandbox_id}/fork", {"count": 1, "timeout": 60}, "json")
    assert forks.status_code == 201, forks.content
    [fork] = forks.json()
    assert_local_domain(fork["sandbox"], "sandboxes.example.test:8443")
