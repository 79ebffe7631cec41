from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team
from tests.support.factories import ApiKeyFactory, TeamFactory


@pytest.fixture
def team(db: None) -> Team:
    return TeamFactory.create()


@pytest.fixture
def api_key(team: Team) -> ApiKey:
    """A live key of ``team``; its raw value is ``api_key.raw``."""
    return ApiKeyFactory.create(team=team)


@pytest.fixture
def anonymous_client() -> APIClient:
    return APIClient()


@pytest.fixture
def api_client(api_key: ApiKey) -> APIClient:
    """A DRF client that authenticates as ``team`` with the ``X-API-Key`` header."""
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=api_key.raw)  # type: ignore[attr-defined]
    return client
