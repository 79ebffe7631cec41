"""The system team owns the builds of the public templates the service makes
(``code-interpreter-v1``): no API key ever authenticates as it, so no caller reaches what it
owns through the API."""

from __future__ import annotations

import secrets
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from e2bfacade.auth import forget_api_keys
from e2bfacade.models import (
    SYSTEM_TEAM_NAME,
    ApiKey,
    SystemTeamTaken,
    Team,
    api_key_create,
    hash_api_key,
    system_team,
)
from templates.builds.services import build_submit_system
from templates.models import Template, TemplateBuild

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls")]

BODY = {"fromTemplate": "base", "steps": [{"type": "RUN", "args": ["true"]}]}


def test_the_system_team_is_made_once_and_found_again() -> None:
    first = system_team()
    assert first.system and first.name == SYSTEM_TEAM_NAME
    assert system_team().pk == first.pk
    assert Team.objects.filter(system=True).count() == 1


def test_a_team_holding_the_system_teams_name_is_not_taken_for_it() -> None:
    Team.objects.create(name=SYSTEM_TEAM_NAME)
    with pytest.raises(SystemTeamTaken):
        system_team()


def test_the_system_team_gets_no_api_key() -> None:
    team = system_team()
    with pytest.raises(ValueError, match="no API keys"):
        api_key_create(team=team)
    with pytest.raises(CommandError, match="service's own team"):
        call_command("create_team", SYSTEM_TEAM_NAME, stdout=StringIO())
    assert not ApiKey.objects.filter(team=team).exists()


def test_a_key_of_the_system_team_written_into_the_database_does_not_authenticate() -> None:
    raw = "e2b_" + secrets.token_hex(20)
    ApiKey.objects.create(team=system_team(), key_hash=hash_api_key(raw), prefix=raw[:10])
    forget_api_keys()
    assert ApiKey.objects.resolve(raw) is None
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=raw)
    assert client.get("/test/whoami").status_code == 401


def test_a_system_build_is_only_of_a_public_template_by_the_system_team() -> None:
    own = Team.objects.create(name="acme")
    team_template = Template.objects.create(team=own, alias="mine", image_id="")
    public = Template.objects.create(template_id="pub-x", alias="pub-x", image_id="")

    def submit(template: Template, team: Team) -> TemplateBuild:
        return build_submit_system(
            template=template, team=team, body=BODY, tags=["default"], cpu_count=2, memory_mb=1024
        )

    with pytest.raises(ValueError):
        submit(team_template, system_team())
    with pytest.raises(ValueError):
        submit(public, own)
    build = submit(public, system_team())
    assert build.status == "building" and build.team_id == system_team().pk
    # The same steps again: the build already running answers, none is added.
    again = submit(public, system_team())
    assert again.pk == build.pk
