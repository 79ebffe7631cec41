"""The Code Interpreter suite: the unmodified ``e2b-code-interpreter`` (Python) and
``@e2b/code-interpreter`` (JS) SDKs against a real e2bfacade with the ``code-interpreter-v1``
template built by ``manage.py build_code_interpreter`` (a build of the template pipeline, in a
build sandbox, from wheels and npm packages fetched on the host), its warm pool on
(``SANDBOX_WARM_POOL`` 1, the default).
Black-box, like tests/contract: only HTTP, through the SDKs or httpx, with the printed
exports (``E2B_API_URL``, ``E2B_SANDBOX_URL``, ``E2B_API_KEY``)."""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b_code_interpreter import Sandbox

from tests.support.live_fixtures import point_sdk
from tests.support.live_server import REPO, LiveServer, ServerError, live_server, manage

# Where a package install on the host would land: the service's venv and Debian's python3.
HOST_SITE_PACKAGES = sorted(
    {
        Path(sysconfig.get_paths()["purelib"]),
        Path(sysconfig.get_paths()["platlib"]),
        Path("/usr/lib/python3/dist-packages"),
        Path(f"/usr/local/lib/python3.{sys.version_info.minor}/dist-packages"),
    }
)


def host_site_packages() -> dict[str, tuple[int, int]]:
    """Every entry under the host's site-packages with its size and mtime: what an install
    on the host would change."""
    seen: dict[str, tuple[int, int]] = {}
    for root in HOST_SITE_PACKAGES:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for name in (*dirnames, *filenames):
                path = os.path.join(dirpath, name)
                info = os.lstat(path)
                seen[path] = (info.st_size, info.st_mtime_ns)
        seen[str(root)] = (0, root.stat().st_mtime_ns)
    return seen


@dataclass(frozen=True)
class CiBuild:
    server: LiveServer
    output: str  # what the session's build_code_interpreter printed
    seconds: float
    site_packages_before: dict[str, tuple[int, int]]


@pytest.fixture(scope="session")
def ci_build() -> Iterator[CiBuild]:
    import time

    suite_url = os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"
    try:
        with live_server(suite_url) as server:
            before = host_site_packages()
            began = time.monotonic()
            out = manage(server.env, "build_code_interpreter", timeout=1800)
            assert "code-interpreter-v1" in out, out
            yield CiBuild(server, out, time.monotonic() - began, before)
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def ci_server(ci_build: CiBuild) -> LiveServer:
    return ci_build.server


@pytest.fixture
def ci_env(ci_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    point_sdk(monkeypatch, ci_server, ci_server.api_key)
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
