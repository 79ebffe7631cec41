"""A team's API keys and access tokens through E2B's routes, over HTTP through the whole
Django stack (auth, throttle, error handler) on PostgreSQL.

An API key never manages keys or tokens (a leaked key cannot mint more): an access token
(``Authorization: Bearer``) or the operator's admin token (``X-Admin-Token`` with
``X-Team-ID``) does. Keys are listed masked as E2B masks them, with ``lastUsed``; a created
key is shown once and stored hashed; every change lands in the admin site's history; the
team's last key cannot be deleted; another team's key or token is a 404."""

from __future__ import annotations

import re
import secrets
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.core.management import call_command
from django.db import connection
from rest_framework.test import APIClient

from e2bfacade.auth import forget_api_keys
from e2bfacade.models import AccessToken, ApiKey, Team, access_token_mint
from tests.support.factories import ApiKeyFactory, TeamFactory

pytestmark = pytest.mark.django_db

ADMIN_TOKEN = "admin-" + secrets.token_hex(24)
ROUTES = [
    ("get", "/api-keys"),
    ("post", "/api-keys"),
    ("patch", "/api-keys/00000000-0000-0000-0000-000000000000"),
    ("delete", "/api-keys/00000000-0000-0000-0000-000000000000"),
    ("post", "/access-tokens"),
    ("delete", "/access-tokens/00000000-0000-0000-0000-000000000000"),
    ("get", "/teams"),
]


@pytest.fixture(autouse=True)
def admin_token(settings: Any) -> str:
    settings.E2BFACADE_ADMIN_TOKEN = ADMIN_TOKEN
    forget_api_keys()
    return ADMIN_TOKEN


def bearer(team: Team) -> APIClient:
    _, raw = access_token_mint(team=team, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_X_TEAM_ID=str(team.pk))
    return client


def admin(team: Team | None) -> APIClient:
    client = APIClient()
    headers = {"HTTP_X_ADMIN_TOKEN": ADMIN_TOKEN}
    if team is not None:
        headers["HTTP_X_TEAM_ID"] = str(team.pk)
    client.credentials(**headers)
    return client


def history(obj: Any) -> list[tuple[int, str]]:
    return [
        (e.action_flag, e.change_message)
        for e in LogEntry.objects.filter(object_id=str(obj.pk)).order_by("pk")
    ]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_an_api_key_can_neither_read_nor_mint_keys_or_tokens(
    api_client: APIClient, method: str, path: str
) -> None:
    response = getattr(api_client, method)(path, {"name": "more"}, format="json")

    assert response.status_code == 401, response.content
    body = response.json()
    assert body["code"] == 401
    assert "an API key cannot manage keys or tokens" in body["message"]
    assert ApiKey.objects.count() == 1 and AccessToken.objects.count() == 0


def test_a_created_key_is_shown_once_works_and_is_stored_only_hashed(team: Team) -> None:
    ApiKeyFactory.create(team=team)
    client = bearer(team)

    created = client.post("/api-keys", {"name": "ci"}, format="json")

    assert created.status_code == 201, created.content
    body = created.json()
    raw = body["key"]
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", raw)
    assert body["name"] == "ci" and body["createdBy"] is None and body["lastUsed"] is None
    assert body["mask"] == {
        "prefix": "e2b_",
        "valueLength": 40,
        "maskedValuePrefix": raw[4:6],
        "maskedValueSuffix": raw[-4:],
    }
    with connection.cursor() as cursor:  # nowhere in the table, whatever the column
        cursor.execute("SELECT * FROM e2bfacade_apikey")
        assert not [row for row in cursor.fetchall() if raw in " ".join(map(str, row))]
    listed = client.get("/api-keys")
    assert raw not in listed.content.decode()
    works = APIClient().get("/v2/sandboxes", HTTP_X_API_KEY=raw)
    assert works.status_code == 200, works.content


def test_the_list_shows_each_live_key_masked_with_when_it_was_last_used(
    team: Team, api_key: ApiKey
) -> None:
    client = bearer(team)
    unused = ApiKeyFactory.create(team=team, name="unused")
    ApiKeyFactory.create(team=TeamFactory.create())  # another team's: never listed
    assert client.get("/api-keys").json()[0]["lastUsed"] is None

    assert APIClient().get("/v2/sandboxes", HTTP_X_API_KEY=api_key.raw).status_code == 200  # type: ignore[attr-defined]
    listed = client.get("/api-keys")

    assert listed.status_code == 200, listed.content
    by_id = {k["id"]: k for k in listed.json()}
    assert set(by_id) == {str(api_key.public_id), str(unused.public_id)}
    used = by_id[str(api_key.public_id)]
    assert used["lastUsed"] is not None
    assert by_id[str(unused.public_id)]["lastUsed"] is None
    assert used["mask"]["maskedValueSuffix"] == api_key.raw[-4:]  # type: ignore[attr-defined]
    assert set(used) == {"id", "name", "mask", "createdAt", "createdBy", "lastUsed"}


def test_renaming_and_deleting_a_key_answer_e2bs_statuses_and_are_in_the_admin_history(
    team: Team, api_key: ApiKey
) -> None:
    client = bearer(team)
    spare = ApiKeyFactory.create(team=team, name="spare")
    made = client.post("/api-keys", {"name": "temp"}, format="json").json()
    key = ApiKey.objects.get(public_id=made["id"])

    renamed = client.patch(f"/api-keys/{made['id']}", {"name": "renamed"}, format="json")
    deleted = client.delete(f"/api-keys/{made['id']}")
    again = client.delete(f"/api-keys/{made['id']}")

    assert renamed.status_code == 200, renamed.content
    assert deleted.status_code == 204, deleted.content
    assert again.status_code == 404 and again.json()["code"] == 404
    assert [k["id"] for k in client.get("/api-keys").json()] == [
        str(api_key.public_id),
        str(spare.public_id),
    ]
    assert APIClient().get("/v2/sandboxes", HTTP_X_API_KEY=made["key"]).status_code == 401
    actions = history(key)
    assert [flag for flag, _ in actions] == [ADDITION, CHANGE, DELETION]
    assert "Renamed from 'temp'" in actions[1][1]
    assert all("by access token sk_e2b_" in message for _, message in actions)


def test_the_teams_last_key_cannot_be_deleted(team: Team, api_key: ApiKey) -> None:
    response = bearer(team).delete(f"/api-keys/{api_key.public_id}")

    assert response.status_code == 400, response.content
    assert "last API key" in response.json()["message"]
    assert APIClient().get("/v2/sandboxes", HTTP_X_API_KEY=api_key.raw).status_code == 200  # type: ignore[attr-defined]


def test_another_teams_key_and_token_are_not_found(team: Team, api_key: ApiKey) -> None:
    other = TeamFactory.create()
    theirs = ApiKeyFactory.create(team=other)
    ApiKeyFactory.create(team=other)
    their_token, _ = access_token_mint(team=other, name="theirs")
    client = bearer(team)

    for response in (
        client.patch(f"/api-keys/{theirs.public_id}", {"name": "mine"}, format="json"),
        client.delete(f"/api-keys/{theirs.public_id}"),
        client.delete(f"/access-tokens/{their_token.pk}"),
        admin(team).delete(f"/api-keys/{theirs.public_id}"),
        admin(team).delete(f"/admin/teams/{team.pk}/api-keys/{theirs.public_id}"),
    ):
        assert response.status_code == 404, response.content
        assert response.json()["code"] == 404
    theirs.refresh_from_db()
    assert theirs.name != "mine" and theirs.revoked_at is None
    assert AccessToken.objects.filter(pk=their_token.pk).exists()


def test_a_malformed_id_or_name_is_a_400_never_a_500(team: Team, api_key: ApiKey) -> None:
    client = bearer(team)

    for response in (
        client.patch("/api-keys/not-a-uuid", {"name": "x"}, format="json"),
        client.delete("/access-tokens/not-a-uuid"),
        client.post("/api-keys", {"name": ""}, format="json"),
        client.post("/api-keys", {"name": 7}, format="json"),
        client.post("/api-keys", {}, format="json"),
        client.post("/access-tokens", {"name": "x" * 256}, format="json"),
        client.patch(f"/api-keys/{api_key.public_id}", ["name"], format="json"),
    ):
        assert response.status_code == 400, response.content
        assert response.json()["code"] == 400


def test_an_access_token_is_for_its_own_team_only(team: Team) -> None:
    other = TeamFactory.create()
    client = bearer(team)
    client.credentials(
        HTTP_AUTHORIZATION=client._credentials["HTTP_AUTHORIZATION"],  # type: ignore[attr-defined]
        HTTP_X_TEAM_ID=str(other.pk),
    )

    response = client.get("/api-keys")

    assert response.status_code == 401, response.content
    assert "X-Team-ID" in response.json()["message"]
    wrong = APIClient().get("/teams", HTTP_AUTHORIZATION="Bearer sk_e2b_" + "0" * 40)
    assert wrong.status_code == 401 and wrong.json()["message"] == "invalid access token"


def test_get_teams_answers_the_tokens_team_with_its_team_id(team: Team) -> None:
    response = bearer(team).get("/teams")

    assert response.status_code == 200, response.content
    assert response.json() == [
        {"teamID": str(team.pk), "name": team.name, "apiKey": "", "isDefault": True}
    ]


def test_an_access_token_mints_another_and_deleting_one_ends_it(team: Team) -> None:
    client = bearer(team)

    created = client.post("/access-tokens", {"name": "laptop"}, format="json")

    assert created.status_code == 201, created.content
    body = created.json()
    assert re.fullmatch(r"sk_e2b_[0-9a-f]{40}", body["token"])
    assert body["mask"]["prefix"] == "sk_e2b_" and body["mask"]["valueLength"] == 40
    assert body["mask"]["maskedValueSuffix"] == body["token"][-4:]
    second = APIClient()
    second.credentials(HTTP_AUTHORIZATION=f"Bearer {body['token']}")
    assert second.get("/teams").status_code == 200
    assert second.delete(f"/access-tokens/{body['id']}").status_code == 204
    assert second.get("/teams").status_code == 401
    token = AccessToken(pk=body["id"])
    assert [flag for flag, _ in history(token)] == [ADDITION, DELETION]


def test_the_admin_token_manages_any_teams_keys_with_x_team_id(team: Team, api_key: ApiKey) -> None:
    listed = admin(team).get("/api-keys")
    created = admin(None).post(f"/admin/teams/{team.pk}/api-keys", {"name": "ops"}, format="json")

    assert listed.status_code == 200, listed.content
    assert [k["id"] for k in listed.json()] == [str(api_key.public_id)]
    assert created.status_code == 201, created.content
    made = created.json()
    assert made["key"].startswith("e2b_") and made["name"] == "ops"
    deleted = admin(None).delete(f"/admin/teams/{team.pk}/api-keys/{made['id']}")
    assert deleted.status_code == 204, deleted.content
    assert "by the admin token" in history(ApiKey.objects.get(public_id=made["id"]))[0][1]


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({"HTTP_X_ADMIN_TOKEN": "wrong" * 8}, 401, "invalid admin token"),
        ({"HTTP_X_ADMIN_TOKEN": ADMIN_TOKEN}, 401, "X-Team-ID header is required"),
        ({"HTTP_X_ADMIN_TOKEN": ADMIN_TOKEN, "HTTP_X_TEAM_ID": "999999"}, 404, "not found"),
        ({"HTTP_X_ADMIN_TOKEN": ADMIN_TOKEN, "HTTP_X_TEAM_ID": "x'; --"}, 404, "not found"),
        ({}, 401, "missing credentials"),
    ],
)
def test_the_admin_token_is_checked_and_needs_a_team(
    team: Team, headers: dict[str, str], status: int, message: str
) -> None:
    response = APIClient().get("/api-keys", **headers)  # type: ignore[arg-type]

    assert response.status_code == status, response.content
    assert message in response.json()["message"]


def test_without_a_configured_admin_token_every_admin_token_is_refused(
    team: Team, settings: Any
) -> None:
    settings.E2BFACADE_ADMIN_TOKEN = ""

    response = APIClient().get("/api-keys", HTTP_X_ADMIN_TOKEN="", HTTP_X_TEAM_ID=str(team.pk))

    assert response.status_code == 401, response.content
    assert "not configured" in response.json()["message"]


def test_key_routes_count_against_the_teams_rate_limit(team: Team, settings: Any) -> None:
    settings.API_RATE_LIMIT = 2
    client = bearer(team)

    statuses = [client.get("/api-keys").status_code for _ in range(3)]

    assert statuses == [200, 200, 429]


def test_create_access_token_prints_the_token_last_and_it_reads_the_team() -> None:
    out = StringIO()
    call_command("create_team", "tokens-team", stdout=out)
    assert out.getvalue().splitlines()[-1].startswith("e2b_")  # create_team's last: the key

    out = StringIO()
    call_command("create_access_token", "tokens-team", stdout=out)
    raw = out.getvalue().splitlines()[-1]

    assert re.fullmatch(r"sk_e2b_[0-9a-f]{40}", raw)
    teams = APIClient().get("/teams", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert teams.status_code == 200
    assert teams.json()[0]["name"] == "tokens-team"
