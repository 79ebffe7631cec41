"""Contract tests: the unmodified E2B SDKs against a real e2bfacade server.

These tests are black-box. One gunicorn server is started for the whole session (see
tests/support/live_server.py), on a database of its own (a fresh PostgreSQL database beside
the suite's ``DATABASE_URL``, or a temporary SQLite file) and a temporary ``SANDBOX_ROOT``;
the tests talk to it only over HTTP, through the SDKs or httpx. They never touch the Django
test database (no ``django_db`` mark), so they see exactly what an SDK user sees.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.support.live_server import REPO, LiveServer, ServerError, live_server

_server: LiveServer | None = None


@pytest.fixture(scope="session")
def live_server_e2b() -> Iterator[LiveServer]:
    """One e2bfacade for the whole session: gunicorn with 4 workers, its own database and
    sandbox root, two teams. Everything it made is removed at the end."""
    global _server
    suite_url = os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"
    try:
        with live_server(suite_url) as server:
            _server = server
            try:
                yield server
            finally:
                _server = None
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing contract test shows the end of the server's log beside its traceback."""
    report = yield
    if report.failed and _server is not None:
        report.sections.append(("e2bfacade server log (tail)", _server.log_tail()))
    return report


# ------------------------------------------------------------------------------ helpers
@pytest.fixture
def sdk_env(live_server_e2b: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    """Point the E2B SDK at the live server exactly as a user would: E2B_API_URL and
    E2B_API_KEY. E2B_DEBUG stays unset: in debug mode the SDK skips the API entirely."""
    for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_SANDBOX_URL", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_API_URL", live_server_e2b.url)
    monkeypatch.setenv("E2B_API_KEY", live_server_e2b.api_key)
    return live_server_e2b


@pytest.fixture
def envd_env(sdk_env: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    """The SDK pointed at the data plane too, as ``scripts/serve.sh`` prints it: every call to
    a sandbox goes to ``E2B_SANDBOX_URL`` (single-URL mode, sandbox named by header)."""
    monkeypatch.setenv("E2B_SANDBOX_URL", sdk_env.sandbox_url)
    return sdk_env


@pytest.fixture
def tag() -> str:
    """A unique metadata value, so a test lists only the sandboxes it made."""
    return f"t-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def http(live_server_e2b: LiveServer) -> Iterator[httpx.Client]:
    """Raw HTTP as the team ``contract``, for the statuses and shapes the SDKs hide."""
    with httpx.Client(
        base_url=live_server_e2b.url, headers={"X-API-Key": live_server_e2b.api_key}, timeout=30
    ) as client:
        yield client


@pytest.fixture
def other_http(live_server_e2b: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=live_server_e2b.url,
        headers={"X-API-Key": live_server_e2b.other_api_key},
        timeout=30,
    ) as client:
        yield client


@pytest.fixture
def cleanup_server(live_server_e2b: LiveServer) -> LiveServer:
    """Where ``kill_later`` and ``delete_template_later`` (tests/support/cleanup.py) delete
    what a test made; a 404 then is fine (the test deleted it itself)."""
    return live_server_e2b


@pytest.fixture
def make_sandbox(sdk_env: LiveServer, kill_later: Callable[[str], str]) -> Callable[..., Sandbox]:
    """``make_sandbox(**Sandbox.create kwargs)``: a sandbox made through the SDK and killed
    at teardown."""

    def make(**kwargs: Any) -> Sandbox:
        kwargs.setdefault("timeout", 120)
        sandbox = Sandbox.create(**kwargs)
        kill_later(sandbox.sandbox_id)
        return sandbox

    return make


@pytest.fixture
def sandbox(make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    """One running sandbox from the ``base`` template, killed at teardown."""
    return make_sandbox()


@pytest.fixture(scope="module")
def raw(live_server_e2b: LiveServer) -> Iterator[httpx.Client]:
    """httpx on the live server's API with the contract team's key (the raw wire)."""
    with httpx.Client(
        base_url=live_server_e2b.url, headers={"X-API-Key": live_server_e2b.api_key}, timeout=30
    ) as client:
        yield client
