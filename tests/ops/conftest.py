"""Fixtures for the operator-facing tests (admin, health, metrics, logs). Most need only the
database; the ones that create or kill sandboxes ask for ``runtime``: the real local runtime
on the session's short ``SANDBOX_ROOT`` (shared with tests/api's helpers), emptied after each
test."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.runtime.local import LocalRuntime
from tests.api.conftest import sandbox_root as sandbox_root  # the session's runtime root
from tests.support.runtime_support import django_runtime


@pytest.fixture
def runtime(settings: Any, sandbox_root: Path, db: None) -> Iterator[LocalRuntime]:
    yield from django_runtime(settings, sandbox_root)


@pytest.fixture
def create_sandbox(api_client: APIClient, runtime: LocalRuntime) -> Callable[..., Any]:
    """``create_sandbox(key=None, **body)``: POST /v2/sandboxes (templateID base), optionally
    with an Idempotency-Key; returns the response."""

    def create(key: str | None = None, **fields: Any) -> Any:
        headers: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
        return api_client.post(
            "/v2/sandboxes",
            {"templateID": "base", "timeout": 60, **fields},
            format="json",
            **headers,
        )

    return create


@pytest.fixture
def request_log(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The JSON request lines logged so far, parsed. ``e2bfacade.request`` does not
    propagate to the root logger (it has its own JSON handler), so caplog's handler is
    attached to it directly, with the formatter production uses."""
    from e2bfacade.observability import JsonFormatter

    logger = logging.getLogger("e2bfacade.request")
    formatter = JsonFormatter()
    logger.addHandler(caplog.handler)
    try:
        yield lambda: [
            json.loads(formatter.format(r)) for r in caplog.records if r.name == logger.name
        ]
    finally:
        logger.removeHandler(caplog.handler)
