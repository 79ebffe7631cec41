"""Fixtures for the Django-level API tests: DRF's APIClient against the real local runtime.

One runtime per test session lives on a fresh, short ``SANDBOX_ROOT`` under /tmp (it holds
the launcher's unix socket, whose path must stay under 108 bytes). Every test points
``settings.SANDBOX_ROOT`` at it (``get_runtime()`` caches one runtime per root) and, when it
ends, every sandbox in that root is killed and every image but ``base`` deleted, so tests
never see each other's sandboxes. Nothing of the runtime is mocked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team
from e2bfacade.runtime.local import LocalRuntime
from sandboxes import transitions
from tests.support.factories import ApiKeyFactory, TeamFactory
from tests.support.runtime_support import django_runtime, session_sandbox_root


@pytest.fixture(scope="session")
def sandbox_root() -> Iterator[Path]:
    yield from session_sandbox_root("e2ba-")


@pytest.fixture(autouse=True)
def runtime(settings: Any, sandbox_root: Path, db: None) -> Iterator[LocalRuntime]:
    yield from django_runtime(settings, sandbox_root)


@pytest.fixture
def other_team() -> Team:
    return TeamFactory.create()


@pytest.fixture
def other_api_key(other_team: Team) -> ApiKey:
    return ApiKeyFactory.create(team=other_team)


@pytest.fixture
def other_client(other_api_key: ApiKey) -> APIClient:
    """A client of another team: it must never see or touch ``team``'s resources."""
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=other_api_key.raw)  # type: ignore[attr-defined]
    return client


@pytest.fixture
def create_sandbox(api_client: APIClient) -> Callable[..., dict[str, Any]]:
    """``create_sandbox(**body)``: POST /v2/sandboxes (templateID base unless given) and
    return the 201 body."""

    def create(client: APIClient | None = None, **fields: Any) -> dict[str, Any]:
        response = (client or api_client).post(
            "/v2/sandboxes", {"templateID": "base", **fields}, format="json"
        )
        assert response.status_code == 201, response.content
        return response.json()  # type: ignore[no-any-return]

    return create


@pytest.fixture
def fast_transition_wait(monkeypatch: pytest.MonkeyPatch) -> float:
    """Shorten how long a caller waits out another transition before answering 409."""
    monkeypatch.setattr(transitions, "TRANSITION_WAIT_SECONDS", 0.3)
    return 0.3
