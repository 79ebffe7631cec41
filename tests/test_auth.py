from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls")]


def test_request_without_api_key_is_rejected_with_401_in_e2b_shape(
    anonymous_client: APIClient,
) -> None:
    response = anonymous_client.get("/test/whoami")

    assert response.status_code == 401
    body = response.json()
    assert body["code"] == 401
    assert "X-API-Key" in body["message"]


def test_request_with_an_unknown_api_key_is_rejected_with_401(anonymous_client: APIClient) -> None:
    response = anonymous_client.get("/test/whoami", headers={"X-API-Key": "e2b_" + "0" * 40})

    assert response.status_code == 401
    assert response.json()["code"] == 401


def test_revoked_api_key_is_rejected_with_401(api_client: APIClient, api_key: ApiKey) -> None:
    api_key.revoked_at = timezone.now()
    api_key.save(update_fields=["revoked_at"])

    response = api_client.get("/test/whoami")

    assert response.status_code == 401
    assert response.json()["code"] == 401


def test_request_with_a_valid_api_key_reaches_the_view_as_its_team(
    api_client: APIClient, api_key: ApiKey
) -> None:
    response = api_client.get("/test/whoami")

    assert response.status_code == 200
    assert response.json() == {"team": api_key.team.name}


def test_api_key_header_is_matched_case_insensitively(
    anonymous_client: APIClient, api_key: ApiKey
) -> None:
    # The Python SDK sends the header as `X-API-KEY`, lower-cased on the wire by httpx.
    response = anonymous_client.get("/test/whoami", headers={"x-api-key": api_key.raw})  # type: ignore[attr-defined]

    assert response.status_code == 200


def test_health_answers_without_an_api_key(anonymous_client: APIClient) -> None:
    response = anonymous_client.get("/health")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
