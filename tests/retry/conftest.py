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
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.retry.support import checked
from tests.support import live_checks as lc
from tests.support.live_fixtures import attach_log_tails, started
from tests.support.live_server import LiveServer

HERE = Path(__file__).resolve().parent
# Judges what every other module of the package left behind: it runs after them.
LAST = HERE / "test_leaks.py"


@pytest.fixture(scope="package")
def server() -> Iterator[LiveServer]:
    # No rate limit: the package sends a few thousand requests as one team.
    with started(API_RATE_LIMIT="0") as live:
        yield live


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    attach_log_tails(report)
    return report


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
def delete_template_later(server: LiveServer) -> Iterator[Callable[[str], str]]:
    """Templates and snapshots to delete at teardown, after the test's sandboxes are killed
    (``kill_later`` depends on this fixture, so it is torn down first)."""
    refs: list[str] = []

    def register(ref: str) -> str:
        refs.append(ref)
        return ref

    yield register
    with lc.client(server) as client:
        for ref in refs:
            checked(client.delete(f"/templates/{quote(ref, safe='')}"))


@pytest.fixture
def kill_later(
    server: LiveServer, delete_template_later: Callable[[str], str]
) -> Iterator[Callable[[str], str]]:
    ids: list[str] = []

    def register(sandbox_id: str) -> str:
        ids.append(sandbox_id)
        return sandbox_id

    yield register
    with lc.client(server) as client:
        for sandbox_id in ids:
            checked(client.delete(f"/sandboxes/{sandbox_id}"))


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
