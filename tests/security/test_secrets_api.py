"""E2B's secrets API (``/secrets``): values are write-only — stored encrypted, versioned,
covered by the key rotation, and on no read surface: not in a response, an error, a log
line or the admin. Names are canonicalised as E2B does; another team's secret is a 404;
a revoked secret resolves to nothing."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from e2bfacade.models import Team
from sandboxes.secrets import selectors
from tests.support.factories import ApiKeyFactory, TeamFactory

pytestmark = pytest.mark.django_db

VALUE = "sk-live-9f8e7d6c5b4a-never-shown"
VALUE_2 = "sk-live-rotated-0a1b2c3d-never-shown"


def client_of(team: Team) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=ApiKeyFactory.create(team=team).raw)  # type: ignore[attr-defined]
    return client


def create(client: APIClient, body: dict[str, Any]) -> Any:
    return client.post("/secrets", body, format="json")


def raw_values() -> list[bytes]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT value_encrypted FROM sandboxes_secretversion")
        return [bytes(row[0]) for row in cursor.fetchall()]


def test_a_secret_is_created_read_updated_and_listed_in_e2b_shapes_without_its_value(
    api_client: APIClient, team: Team
) -> None:
    created = create(api_client, {"name": "OpenAI-Key", "value": VALUE, "metadata": {"env": "t"}})
    assert created.status_code == 201, created.content
    body = created.json()
    assert set(body) == {"secretID", "name", "currentVersion", "metadata", "createdAt", "updatedAt"}
    assert body["secretID"].startswith("sec_")
    assert body["name"] == "openai-key"  # canonical: lower-cased
    assert body["currentVersion"] == 1
    assert body["metadata"] == {"env": "t"}

    by_name = api_client.get("/secrets/OPENAI-KEY")
    by_id = api_client.get(f"/secrets/{body['secretID']}")
    assert by_name.status_code == by_id.status_code == 200
    assert by_name.json() == by_id.json() == body

    updated = api_client.post(f"/secrets/{body['secretID']}", {"value": VALUE_2}, format="json")
    assert updated.status_code == 200, updated.content
    assert updated.json()["currentVersion"] == 2
    assert updated.json()["metadata"] == {"env": "t"}  # kept when the update names none
    listed = api_client.get("/secrets")
    assert listed.status_code == 200
    assert [s["name"] for s in listed.json()] == ["openai-key"]

    everything = b"".join(r.content for r in (created, by_name, by_id, updated, listed))
    assert VALUE.encode() not in everything and VALUE_2.encode() not in everything
    # Versions are kept, each encrypted: the current one is what a rule resolves to.
    stored = raw_values()
    assert len(stored) == 2
    assert not any(VALUE.encode() in blob or VALUE_2.encode() in blob for blob in stored)
    assert selectors.secret_value(team_id=team.pk, name="openai-key") == VALUE_2


def test_names_are_refused_as_e2b_refuses_them_without_echoing_the_value(
    api_client: APIClient,
) -> None:
    for name in ("", "a b", "x" * 129, "sec_mine", "a}b", "ünï"):
        answer = create(api_client, {"name": name, "value": VALUE})
        assert answer.status_code == 400, (name, answer.content)
        assert VALUE.encode() not in answer.content
    assert create(api_client, {"name": "dup", "value": VALUE}).status_code == 201
    again = create(api_client, {"name": "DUP", "value": VALUE})
    assert again.status_code == 409
    assert VALUE.encode() not in again.content
    # A value that would break out of an HTTP header is refused, without being echoed.
    bad = create(api_client, {"name": "inject", "value": VALUE + "\r\nX-Evil: 1"})
    assert bad.status_code == 400
    assert VALUE.encode() not in bad.content
    assert (
        create(api_client, {"name": "meta", "value": "v", "metadata": {"k": 1}}).status_code == 400
    )


def test_another_teams_secret_is_a_404_by_id_and_by_name(api_client: APIClient) -> None:
    other = client_of(TeamFactory.create())
    theirs = create(other, {"name": "theirs", "value": VALUE}).json()
    for selector in (theirs["secretID"], "theirs"):
        assert api_client.get(f"/secrets/{selector}").status_code == 404
        update = api_client.post(f"/secrets/{selector}", {"value": "x"}, format="json")
        assert update.status_code == 404
        assert api_client.delete(f"/secrets/{selector}").status_code == 404
    assert api_client.get("/secrets").json() == []
    assert other.get("/secrets/theirs").json()["currentVersion"] == 1


def test_a_deleted_secret_resolves_to_nothing_and_its_name_can_be_reused(
    api_client: APIClient, team: Team
) -> None:
    secret = create(api_client, {"name": "gone", "value": VALUE}).json()
    assert selectors.secret_value(team_id=team.pk, name="gone") == VALUE
    assert api_client.delete(f"/secrets/{secret['secretID']}").status_code == 204
    assert selectors.secret_value(team_id=team.pk, name="gone") is None
    assert api_client.get(f"/secrets/{secret['secretID']}").status_code == 404
    assert api_client.delete("/secrets/gone").status_code == 404
    assert raw_values() == [b""]  # the revoked value is erased, not only hidden
    again = create(api_client, {"name": "gone", "value": VALUE_2})
    assert again.status_code == 201 and again.json()["secretID"] != secret["secretID"]
    assert selectors.secret_value(team_id=team.pk, name="gone") == VALUE_2


def test_list_pages_with_limit_and_next_token(api_client: APIClient) -> None:
    for n in range(3):
        create(api_client, {"name": f"key-{n}", "value": VALUE})
    first = api_client.get("/secrets?limit=2")
    assert [s["name"] for s in first.json()] == ["key-0", "key-1"]
    token = first["X-Next-Token"]
    second = api_client.get(f"/secrets?limit=2&nextToken={token}")
    assert [s["name"] for s in second.json()] == ["key-2"]
    assert "X-Next-Token" not in second
    assert api_client.get("/secrets?limit=0").status_code == 400
    assert api_client.get("/secrets?nextToken=forged").status_code == 400


def test_secret_values_are_covered_by_the_key_rotation(
    api_client: APIClient, team: Team, settings: Any
) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [old]
    create(api_client, {"name": "rotated", "value": VALUE})
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [new, old]
    out = io.StringIO()
    call_command("rotate_idempotency_keys", stdout=out)
    assert "re-encrypted 1 secret versions" in out.getvalue()
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [new]
    (blob,) = raw_values()
    Fernet(new.encode()).decrypt(blob)
    with pytest.raises(InvalidToken):
        Fernet(old.encode()).decrypt(blob)
    assert selectors.secret_value(team_id=team.pk, name="rotated") == VALUE


def test_no_log_line_holds_a_secret_value(
    api_client: APIClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = create(api_client, {"name": "logged", "value": VALUE}).json()
    api_client.post(f"/secrets/{secret['secretID']}", {"value": VALUE_2}, format="json")
    create(api_client, {"name": "bad name", "value": VALUE})
    api_client.delete("/secrets/logged")
    text = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "/secrets" in text  # the request lines were captured...
    assert VALUE not in text and VALUE_2 not in text  # ...and hold no value


def test_the_admin_shows_a_secrets_metadata_only_and_cannot_change_it(
    api_client: APIClient,
) -> None:
    secret = create(api_client, {"name": "admin-view", "value": VALUE}).json()
    admin = User.objects.create_superuser("root", "root@example.com", "pw")
    browser = Client()
    browser.force_login(admin)
    listing = browser.get("/admin/sandboxes/secret/")
    assert listing.status_code == 200
    assert b"admin-view" in listing.content
    page = browser.get(f"/admin/sandboxes/secret/{secret['secretID']}/change/")
    assert page.status_code == 200
    assert b"admin-view" in page.content
    for response in (listing, page):
        assert VALUE.encode() not in response.content
        assert b"gAAAA" not in response.content  # no Fernet token either
    assert browser.get("/admin/sandboxes/secretversion/").status_code == 404
    assert browser.get("/admin/sandboxes/secret/add/").status_code == 403


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([], "must be an object of domain: [rule]"),
        ({"bad domain": []}, "invalid rule domain bad domain"),
        ({"api.example.com": {}}, "rules of api.example.com must be a list"),
        ({"api.example.com": [{"transform": {"headers": {"Host": "x"}}}]}, "cannot be set"),
        ({"api.example.com": [{"transform": {"headers": {"X-A": "a\r\nX-B: b"}}}]}, "control"),
        ({"api.example.com": [{"transform": {"headers": {"X-A": 1}}}]}, "must be a string"),
    ],
)
def test_malformed_transform_rules_are_a_400_naming_what_is_wrong(
    api_client: APIClient, rules: Any, message: str
) -> None:
    network = {"allowOut": ["api.example.com"], "denyOut": ["0.0.0.0/0"], "rules": rules}
    answer = api_client.post(
        "/v2/sandboxes", {"templateID": "base", "network": network}, format="json"
    )
    assert answer.status_code == 400, answer.content
    assert message in answer.json()["message"]
