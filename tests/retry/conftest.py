"""Every row of the retry table (docs/idempotency.md, "Retry table"), through a real running
server: gunicorn with 4 workers and the lifecycle worker, its own database and sandbox root,
raw HTTP.

Each row sends the same request 5 times and 50 times in a row, and from two callers at
once (two threads released by a barrier, several rounds), and asserts exactly the answers
the table documents, that the effect happened once (read back from the runtime itself and
from the server's database), and that no request ever got a 5xx. One server serves the
whole package (one module per area of the table); test_leaks.py runs after all of them and
checks that they leaked nothing: the runtime holds exactly the sandboxes the API lists as
live.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.retry.support import checked
from tests.support import live_checks as lc
from tests.support.live_fixtures import pytest_runtest_makereport, started  # noqa: F401 - hook
from tests.support.live_server import LiveServer

HERE = Path(__file__).resolve().parent
# Judges what every other module of the package left behind: it runs after them.
LAST = HERE / "test_leaks.py"


@pytest.fixture(scope="package")
def server() -> Iterator[LiveServer]:
    # No rate limit: the package sends a few thousand requests as one team.
    with started(API_RATE_LIMIT="0") as live:
        yield live


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move test_leaks.py's tests after the package's last other test (this hook sees the
    whole session's items: those of other directories keep their places)."""
    last = [item for item in items if item.path == LAST]
    if not last:
        return
    rest = [item for item in items if item.path != LAST]
    ours = [i for i, item in enumerate(rest) if item.path.parent == HERE]
    at = ours[-1] + 1 if ours else len(rest)
    items[:] = rest[:at] + last + rest[at:]


@pytest.fixture(scope="package")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with lc.client(server) as client:
        yield client


@pytest.fixture
def tag() -> str:
    return f"retry-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def cleanup_server(server: LiveServer) -> LiveServer:
    """Where ``kill_later`` and ``delete_template_later`` (tests/support/cleanup.py) delete
    what a test made."""
    return server


@pytest.fixture
def cleanup_check() -> Callable[[httpx.Response], httpx.Response]:
    """A cleanup's answer too is never a 5xx, and every error is in E2B's shape."""
    return checked


@pytest.fixture
def new_sandbox(
    http: httpx.Client, kill_later: Callable[[str], str], tag: str
) -> Callable[..., str]:
    """``new_sandbox(timeout=600, **body)``: a running sandbox, killed at teardown."""

    def make(timeout: int = 600, **body: Any) -> str:
        payload = {"templateID": "base", "timeout": timeout, "metadata": {"tag": tag}, **body}
        response = checked(http.post("/v2/sandboxes", json=payload))
        assert response.status_code == 201, response.text
        return kill_later(response.json()["sandboxID"])

    return make
