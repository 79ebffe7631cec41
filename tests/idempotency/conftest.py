"""Fixtures for the Django-level idempotency tests: DRF's APIClient against the real local
runtime on a short temporary ``SANDBOX_ROOT`` (its launcher socket path must stay under 108
bytes). Every sandbox a test made is killed when it ends. Nothing of the runtime is mocked;
the only fault injected in-process is :func:`crash_at`, which stands in for a process dying
at one of the failpoints (the real-process tests kill real gunicorn workers instead).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team
from e2bfacade.runtime.local import LocalRuntime
from idempotency import claims as idempotency_claims
from sandboxes import services as sandbox_services
from tests.support.factories import ApiKeyFactory, TeamFactory
from tests.support.runtime_support import django_runtime, session_sandbox_root


class Crash(BaseException):
    """Stands in for the process dying: a BaseException, so no ``except Exception`` on the
    way up handles it, exactly as nothing runs after a SIGKILL (``finally`` blocks aside)."""


@pytest.fixture(scope="session")
def sandbox_root() -> Iterator[Path]:
    yield from session_sandbox_root("e2bi-")


@pytest.fixture
def runtime(settings: Any, sandbox_root: Path, db: None) -> Iterator[LocalRuntime]:
    yield from django_runtime(settings, sandbox_root)


@pytest.fixture
def other_team(db: None) -> Team:
    return TeamFactory.create()


@pytest.fixture
def other_client(other_team: Team) -> APIClient:
    key: ApiKey = ApiKeyFactory.create(team=other_team)
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=key.raw)  # type: ignore[attr-defined]
    return client


@pytest.fixture
def key() -> str:
    """A fresh, valid Idempotency-Key (a lowercase UUID, as the contract suggests)."""
    return str(uuid.uuid4())


PostFn = Callable[..., Any]


@pytest.fixture
def post(api_client: APIClient) -> PostFn:
    """``post(body, key=None, path="/v2/sandboxes", client=api_client)``: a JSON create,
    with the ``Idempotency-Key`` header when ``key`` is given. ``body`` may be a dict or
    raw JSON text (sent byte for byte)."""

    def send(
        body: dict[str, Any] | str,
        key: str | None = None,
        path: str = "/v2/sandboxes",
        client: APIClient | None = None,
    ) -> Any:
        headers = {} if key is None else {"Idempotency-Key": key}
        c = client or api_client
        if isinstance(body, str):
            return c.post(path, data=body, content_type="application/json", headers=headers)
        return c.post(path, body, format="json", headers=headers)

    return send


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``crash_at(point)``: the next request that reaches failpoint ``point`` dies there
    (raises :class:`Crash`), once. Points: after_claim, after_runtime_create,
    before_complete, after_complete."""

    def arm(point: str) -> None:
        fired: list[str] = []

        def failpoint(name: str) -> None:
            if name == point and not fired:
                fired.append(name)
                raise Crash(name)

        # Each module bound the name at import: patch both places that call it.
        monkeypatch.setattr(idempotency_claims, "failpoint", failpoint)
        monkeypatch.setattr(sandbox_services, "failpoint", failpoint)

    return arm


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "live_server: starts real gunicorn servers on a fresh PostgreSQL database (part of "
        "the default run and of CI; deselect with -m 'not live_server' for a quick loop)",
    )
