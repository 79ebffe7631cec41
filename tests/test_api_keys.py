"""API keys are minted as ``e2b_`` + 40 lowercase hex digits — E2B SDKs from about 2.25 to
2.4x refuse, client-side, any key not matching ``^e2b_[0-9a-f]+$`` — and keys minted in any
other format before keep authenticating."""

from __future__ import annotations

import re
import secrets
from io import StringIO

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team, api_key_create, hash_api_key
from tests.support.factories import TeamFactory

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls")]

# What this server promises, and (prefix only) what the SDKs 2.25-2.4x check.
MINTED = re.compile(r"^e2b_[0-9a-f]{40}$")
SDK_CHECK = re.compile(r"^e2b_[0-9a-f]+$")


def test_a_freshly_minted_api_key_is_e2b_and_40_lowercase_hex_digits(team: Team) -> None:
    raws = [api_key_create(team=team)[1] for _ in range(20)]

    for raw in raws:
        assert MINTED.fullmatch(raw), raw
        assert SDK_CHECK.fullmatch(raw)
    assert len(set(raws)) == len(raws)


def test_the_key_create_team_prints_is_e2b_and_40_lowercase_hex_digits() -> None:
    out = StringIO()
    call_command("create_team", "acme", stdout=out)

    raw = out.getvalue().splitlines()[-1]
    assert MINTED.fullmatch(raw), raw


@pytest.mark.parametrize(
    "legacy",
    [
        secrets.token_urlsafe(32),  # no prefix at all, url-safe base64 (- and _)
        "e2b_" + secrets.token_hex(20).upper(),  # upper-case hex
        "e2b_" + secrets.token_hex(32),  # another length
        "sk-" + secrets.token_urlsafe(24),
    ],
)
def test_a_key_minted_in_an_older_format_still_authenticates(
    anonymous_client: APIClient, legacy: str
) -> None:
    # Exactly what an older build stored: the key's hash and its first characters.
    team = TeamFactory.create(name="legacy")
    ApiKey.objects.create(team=team, key_hash=hash_api_key(legacy), prefix=legacy[:10])

    response = anonymous_client.get("/test/whoami", headers={"X-API-Key": legacy})

    assert response.status_code == 200, response.content
    assert response.json() == {"team": "legacy"}
