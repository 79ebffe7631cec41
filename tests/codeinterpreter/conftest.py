"""The Code Interpreter suite: the unmodified ``e2b-code-interpreter`` (Python) and
``@e2b/code-interpreter`` (JS) SDKs against a real e2bfacade with the ``code-interpreter-v1``
template built by ``manage.py build_code_interpreter`` (from Debian's python3 and PyPI; pip's
cache makes a second build quick), its warm pool on (``SANDBOX_WARM_POOL`` 1, the default).
Black-box, like tests/contract: only HTTP, through the SDKs or httpx, with the printed
exports (``E2B_API_URL``, ``E2B_SANDBOX_URL``, ``E2B_API_KEY``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from e2b_code_interpreter import Sandbox

from tests.support.live_server import REPO, LiveServer, ServerError, live_server, manage


@pytest.fixture(scope="session")
def ci_server() -> Iterator[LiveServer]:
    suite_url = os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"
    try:
        with live_server(suite_url) as server:
            out = manage(server.env, "build_code_interpreter", timeout=1200)
            assert "code-interpreter-v1" in out, out
            yield server
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def ci_env(ci_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_API_URL", ci_server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", ci_server.sandbox_url)
    monkeypatch.setenv("E2B_API_KEY", ci_server.api_key)
    return ci_server


@pytest.fixture
def make_ci(ci_env: LiveServer) -> Iterator[Callable[..., Sandbox]]:
    """``make_ci(**Sandbox.create kwargs)``: a code-interpreter sandbox, killed at teardown."""
    made: list[Sandbox] = []

    def make(**kwargs: Any) -> Sandbox:
        kwargs.setdefault("timeout", 300)
        sandbox = Sandbox.create(**kwargs)
        made.append(sandbox)
        return sandbox

    yield make
    for sandbox in made:
        try:
            sandbox.kill()
        except Exception:  # noqa: BLE001 - a test may have killed it already
            pass


@pytest.fixture
def sbx(make_ci: Callable[..., Sandbox]) -> Sandbox:
    return make_ci()


@pytest.fixture
def ci_http(ci_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=ci_server.url, headers={"X-API-Key": ci_server.api_key}, timeout=60
    ) as client:
        yield client
