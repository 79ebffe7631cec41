"""Helpers shared by the API tests (fixtures are in conftest.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from e2bfacade.runtime.base import SandboxNotFound, SandboxState
from e2bfacade.runtime.local import LocalRuntime

NOT_FOUND = "Sandbox \"{}\" doesn't exist or you don't have access to it"
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs PostgreSQL: SQLite has no row locks (SELECT ... FOR UPDATE is a no-op) and "
    "one writer at a time, so concurrent callers are only guaranteed on PostgreSQL",
)


def runtime_state(rt: LocalRuntime, sandbox_id: str) -> SandboxState | None:
    """What the runtime itself reports for the sandbox; None when it has no such sandbox."""
    try:
        return rt.status(sandbox_id).state
    except SandboxNotFound:
        return None


def run_at_once(count: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run ``fn(i)`` in ``count`` threads released together; return their results in order.

    Each thread closes its own database connection when done (Django opens one per thread).
    """
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def assert_error(response: Any, status: int) -> dict[str, Any]:
    """The response is an error in E2B's shape with ``code`` equal to ``status``."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert body["code"] == status
    assert isinstance(body["message"], str) and body["message"]
    return body


def seconds_from_now(moment: datetime) -> float:
    return (moment - timezone.now()).total_seconds()
