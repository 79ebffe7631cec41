from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team, hash_api_key
from tests.support.factories import TeamFactory


def run_create_team(*args: str) -> list[str]:
    out = StringIO()
    call_command("create_team", *args, stdout=out)
    return out.getvalue().splitlines()


@pytest.mark.django_db
def test_create_team_creates_a_new_team_with_one_key() -> None:
    lines = run_create_team("acme")

    team = Team.objects.get(name="acme")
    assert list(team.api_keys.values_list("key_hash", flat=True)) == [hash_api_key(lines[-1])]
    assert any("Created team 'acme'" in line for line in lines[:-1])


@pytest.mark.django_db
def test_create_team_reuses_an_existing_team_and_adds_a_new_key() -> None:
    existing = TeamFactory.create(name="acme")

    first = run_create_team("acme")[-1]
    second = run_create_team("acme")[-1]

    assert Team.objects.filter(name="acme").count() == 1
    assert ApiKey.objects.filter(team=existing).count() == 2
    assert first != second


@pytest.mark.django_db
@pytest.mark.urls("tests.urls")
def test_last_line_of_create_team_is_a_key_that_authenticates(
    anonymous_client: APIClient,
) -> None:
    raw = run_create_team("acme")[-1]

    response = anonymous_client.get("/test/whoami", headers={"X-API-Key": raw})

    assert response.status_code == 200
    assert response.json() == {"team": "acme"}


@pytest.mark.django_db
def test_create_team_stores_only_the_hash_of_the_key() -> None:
    raw = run_create_team("acme")[-1]

    key = ApiKey.objects.get()
    stored = [str(value) for value in ApiKey.objects.values().get().values()]
    assert raw not in stored
    assert key.key_hash == hash_api_key(raw)
    assert raw.startswith(key.prefix) and len(key.prefix) < len(raw) // 2


@pytest.mark.django_db
def test_create_team_refuses_a_blank_name() -> None:
    with pytest.raises(CommandError):
        run_create_team("   ")
    assert not Team.objects.exists()
