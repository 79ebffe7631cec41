"""Per-team rate limiting: 429 in E2B's shape with Retry-After, per team, exact."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import RateLimitWindow
from e2bfacade.throttling import purge_windows
from tests.support.factories import ApiKeyFactory

pytestmark = pytest.mark.both_databases


@pytest.fixture
def limited(settings: pytest.FixtureRequest) -> None:
    settings.API_RATE_LIMIT = 3  # type: ignore[attr-defined]
    settings.API_RATE_WINDOW_SECONDS = 3600  # type: ignore[attr-defined]


def test_requests_over_the_team_limit_get_429_with_retry_after(
    limited: None, api_client: APIClient
) -> None:
    statuses = [api_client.get("/v2/sandboxes").status_code for _ in range(5)]

    assert statuses == [200, 200, 200, 429, 429]
    response = api_client.get("/v2/sandboxes")
    body = response.json()
    assert body["code"] == 429 and body["message"]
    assert 1 <= int(response["Retry-After"]) <= 3601


def test_the_limit_is_per_team(limited: None, api_client: APIClient) -> None:
    for _ in range(3):
        api_client.get("/v2/sandboxes")
    assert api_client.get("/v2/sandboxes").status_code == 429

    other = APIClient()
    other.credentials(HTTP_X_API_KEY=ApiKeyFactory.create().raw)  # type: ignore[attr-defined]
    assert other.get("/v2/sandboxes").status_code == 200


@pytest.mark.django_db
def test_unauthenticated_requests_are_not_counted(
    limited: None, anonymous_client: APIClient
) -> None:
    for _ in range(5):
        assert anonymous_client.get("/v2/sandboxes").status_code == 401
    assert not RateLimitWindow.objects.exists()


def test_a_zero_limit_turns_limiting_off(
    settings: pytest.FixtureRequest, api_client: APIClient
) -> None:
    settings.API_RATE_LIMIT = 0  # type: ignore[attr-defined]
    assert all(api_client.get("/v2/sandboxes").status_code == 200 for _ in range(5))


def test_old_windows_are_purged(limited: None, api_client: APIClient) -> None:
    api_client.get("/v2/sandboxes")
    RateLimitWindow.objects.update(window_start=0)

    assert purge_windows() == 1
    assert not RateLimitWindow.objects.exists()
