"""Every route of E2B's published API reaches a view here: none answers the router's
"no route" 404 (``e2bfacade.errors.handler404``), a 405 or a 500.

``E2B_ROUTES`` is the (method, path template) list of ``spec/openapi.yml`` in
github.com/e2b-dev/E2B at b8029973aa7d (2026-08-21), deprecated routes included: old SDKs
still call them. Each is sent once through Django's test client with the credentials E2B
gives it and placeholder ids. What the route then says about those ids — a 404 naming the
sandbox, a 400 on the empty body, a 501 for a feature this build refuses — is its own
business and tested beside it; here only that a view answered counts.

A route this build has no view for is marked ``xfail(strict=True)`` in ``MISSING``, with
the reason: the gap stays visible in every run, and the mark must go once the route is
served.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team, access_token_mint
from e2bfacade.runtime.local import LocalRuntime

E2B_ROUTES: list[tuple[str, str]] = [
    ("GET", "/health"),
    ("GET", "/teams"),
    ("GET", "/teams/{teamID}/metrics"),
    ("GET", "/teams/{teamID}/metrics/max"),
    ("GET", "/sandboxes"),
    ("POST", "/sandboxes"),
    ("GET", "/v2/sandboxes"),
    ("GET", "/sandboxes/metrics"),
    ("GET", "/sandboxes/{sandboxID}/logs"),
    ("GET", "/v2/sandboxes/{sandboxID}/logs"),
    ("GET", "/sandboxes/{sandboxID}"),
    ("DELETE", "/sandboxes/{sandboxID}"),
    ("GET", "/sandboxes/{sandboxID}/metrics"),
    ("POST", "/sandboxes/{sandboxID}/pause"),
    ("POST", "/sandboxes/{sandboxID}/resume"),
    ("POST", "/sandboxes/{sandboxID}/fork"),
    ("POST", "/sandboxes/{sandboxID}/connect"),
    ("POST", "/sandboxes/{sandboxID}/timeout"),
    ("PUT", "/sandboxes/{sandboxID}/network"),
    ("POST", "/sandboxes/{sandboxID}/refreshes"),
    ("POST", "/sandboxes/{sandboxID}/snapshots"),
    ("GET", "/snapshots"),
    ("POST", "/v3/templates"),
    ("GET", "/v2/templates"),
    ("POST", "/v2/templates"),
    ("GET", "/templates/{templateID}/files/{hash}"),
    ("GET", "/templates"),
    ("POST", "/templates"),
    ("GET", "/templates/{templateID}"),
    ("POST", "/templates/{templateID}"),
    ("DELETE", "/templates/{templateID}"),
    ("PATCH", "/templates/{templateID}"),
    ("POST", "/templates/{templateID}/builds/{buildID}"),
    ("POST", "/v2/templates/{templateID}/builds/{buildID}"),
    ("PATCH", "/v2/templates/{templateID}"),
    ("GET", "/templates/{templateID}/builds/{buildID}/status"),
    ("GET", "/templates/{templateID}/builds/{buildID}/logs"),
    ("POST", "/templates/tags"),
    ("DELETE", "/templates/tags"),
    ("GET", "/templates/{templateID}/tags"),
    ("GET", "/templates/aliases/{alias}"),
    ("GET", "/nodes"),
    ("GET", "/nodes/{nodeID}"),
    ("POST", "/nodes/{nodeID}"),
    ("POST", "/admin/teams/{teamID}/sandboxes/kill"),
    ("GET", "/admin/sandboxes/running-counts"),
    ("POST", "/admin/teams/{teamID}/builds/cancel"),
    ("POST", "/admin/teams/{teamID}/api-keys"),
    ("DELETE", "/admin/teams/{teamID}/api-keys/{apiKeyID}"),
    ("POST", "/access-tokens"),
    ("DELETE", "/access-tokens/{accessTokenID}"),
    ("GET", "/api-keys"),
    ("POST", "/api-keys"),
    ("PATCH", "/api-keys/{apiKeyID}"),
    ("DELETE", "/api-keys/{apiKeyID}"),
    ("GET", "/volumes"),
    ("POST", "/volumes"),
    ("GET", "/volumes/{volumeID}"),
    ("DELETE", "/volumes/{volumeID}"),
    ("GET", "/secrets"),
    ("POST", "/secrets"),
    ("GET", "/secrets/{secretID}"),
    ("POST", "/secrets/{secretID}"),
    ("DELETE", "/secrets/{secretID}"),
]

# E2B's routes this build has no view for: each answers the router's 404 today.
MISSING: dict[tuple[str, str], str] = {}

PLACEHOLDER_UUID = "00000000-0000-0000-0000-000000000000"
# Ids no row holds. ``teamID`` is the caller's own team (filled in per test): a team's
# routes check it against the credentials before anything else.
PLACEHOLDERS = {
    "sandboxID": "iplaceholder000000000",
    "templateID": "placeholder-template",
    "buildID": PLACEHOLDER_UUID,
    "hash": "0" * 64,
    "alias": "placeholder-alias",
    "nodeID": "placeholder-node",
    "apiKeyID": PLACEHOLDER_UUID,
    "accessTokenID": PLACEHOLDER_UUID,
    "volumeID": PLACEHOLDER_UUID,
    "secretID": PLACEHOLDER_UUID,
}
ADMIN_TOKEN = secrets.token_hex(24)


def _credentials(method: str, template: str) -> str:
    """The credential E2B's spec gives the route (its first one this build accepts):
    the admin token for operator routes, an access token for a team's keys and tokens,
    else an API key."""
    if template.startswith(("/admin/", "/nodes")):
        return "admin"
    if template == "/teams" or template.startswith(("/api-keys", "/access-tokens")):
        return "token"
    if (method, template) in {
        ("POST", "/templates"),
        ("POST", "/templates/{templateID}"),
        ("POST", "/templates/{templateID}/builds/{buildID}"),
    }:
        return "token"  # E2B's deprecated v1 builds: AccessTokenAuth only
    return "key"


def _client(kind: str, team: Team, api_key_raw: str) -> APIClient:
    client = APIClient()
    if kind == "admin":
        client.credentials(HTTP_X_ADMIN_TOKEN=ADMIN_TOKEN)
    elif kind == "token":
        _, raw = access_token_mint(team=team, name="routes test")
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_X_TEAM_ID=str(team.pk))
    else:
        client.credentials(HTTP_X_API_KEY=api_key_raw)
    return client


def _params(route: tuple[str, str]) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=MISSING[route])] if route in MISSING else []
    return pytest.param(*route, id=f"{route[0]} {route[1]}", marks=marks)


def test_the_route_list_has_no_duplicates_and_the_missing_ones_are_in_it() -> None:
    assert len(set(E2B_ROUTES)) == len(E2B_ROUTES)
    assert set(MISSING) <= set(E2B_ROUTES)


@pytest.mark.parametrize(("method", "template"), [_params(r) for r in E2B_ROUTES])
def test_every_e2b_route_reaches_a_view(
    method: str,
    template: str,
    settings: Any,
    runtime: LocalRuntime,  # a route that gets past its checks meets the real runtime
    team: Team,
    api_key: ApiKey,
) -> None:
    settings.E2BFACADE_ADMIN_TOKEN = ADMIN_TOKEN
    client = _client(_credentials(method, template), team, api_key.raw)  # type: ignore[attr-defined]
    ids = {**PLACEHOLDERS, "teamID": str(team.pk)}
    path = re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], template)
    # An empty JSON object: every body route refuses it (400) or finds no placeholder (404),
    # and the operator's kill and cancel find nothing of the fresh team: nothing is made.
    body = {"data": {}, "format": "json"} if method in {"POST", "PUT", "PATCH"} else {}

    response = getattr(client, method.lower())(path, **body)

    content = response.content.decode(errors="replace")
    shown = f"{method} {path} -> {response.status_code} {content[:300]}"
    print(shown)  # the answer of each route, for `pytest -s`
    assert response.status_code not in (405, 500), shown
    if response.status_code == 404:
        assert not response.json()["message"].startswith("no route for "), shown
