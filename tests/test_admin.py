from __future__ import annotations

import pytest
from django.test import Client

from e2bfacade.models import ApiKey, Team, hash_api_key
from tests.support.factories import ApiKeyFactory

pytestmark = pytest.mark.django_db


def test_adding_an_api_key_in_admin_shows_the_raw_key_once_and_stores_its_hash(
    admin_client: Client, team: Team
) -> None:
    response = admin_client.post(
        "/admin/e2bfacade/apikey/add/", {"team": team.pk, "name": "ci"}, follow=True
    )

    assert response.status_code == 200
    key = ApiKey.objects.get(team=team, name="ci")
    shown = [str(m) for m in response.context["messages"] if "New API key" in str(m)]
    assert len(shown) == 1
    raw = next(word for word in shown[0].split() if word.startswith(key.prefix))
    assert key.key_hash == hash_api_key(raw)
    assert ApiKey.objects.resolve(raw) == key

    again = admin_client.get(f"/admin/e2bfacade/apikey/{key.pk}/change/")
    assert raw not in again.content.decode()


def test_admin_never_displays_a_key_hash(admin_client: Client) -> None:
    key = ApiKeyFactory.create()

    pages = [
        admin_client.get("/admin/e2bfacade/apikey/"),
        admin_client.get(f"/admin/e2bfacade/apikey/{key.pk}/change/"),
    ]

    for page in pages:
        assert page.status_code == 200
        assert key.key_hash not in page.content.decode()


def test_revoke_action_revokes_live_keys(admin_client: Client) -> None:
    key = ApiKeyFactory.create()

    admin_client.post(
        "/admin/e2bfacade/apikey/",
        {"action": "revoke", "_selected_action": [key.pk]},
        follow=True,
    )

    key.refresh_from_db()
    assert key.revoked_at is not None
    assert ApiKey.objects.resolve(key.raw) is None  # type: ignore[attr-defined]
