from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from django.conf import settings
from hypothesis import settings as hypothesis_settings
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team
from e2bfacade.runtime.local import build
from e2bfacade.startup import is_insecure_secret_key
from tests.support.factories import ApiKeyFactory, TeamFactory
from tests.support.runtime_support import session_sandbox_root

# kill_later and delete_template_later, for the suites that drive a live server.
pytest_plugins = ["tests.support.cleanup"]

# The service refuses the built-in, public SECRET_KEY and derives no encryption key from it
# (e2bfacade/startup.py). Unless the environment brings a real one, the suite makes its own:
# for this process's settings (pytest-django loaded them before this file) and, through
# os.environ, for every server, manage.py and subprocess a test starts.
if is_insecure_secret_key(os.environ.get("SECRET_KEY", "")):
    os.environ["SECRET_KEY"] = secrets.token_urlsafe(50)
settings.SECRET_KEY = os.environ["SECRET_KEY"]
# No test sandbox ever reaches a real network: networking is off unless a test gives a
# runtime or server the suite's own test internet as its uplink (tests/support/internet.py).
os.environ["SANDBOX_UPLINK"] = "none"
settings.SANDBOX_NETWORK = None
settings.SANDBOX_RUNTIME_OPTIONS.pop("network", None)
# Every test root compiles the runtime's C helper once (1.9 s of CPU) unless a cache holds
# it: one per run of the suite, shared by its servers and subprocesses through os.environ.
if not os.environ.get(build.CACHE_ENV):
    os.environ[build.CACHE_ENV] = _helper_cache = tempfile.mkdtemp(prefix="e2bfacade-sandboxd-")
    atexit.register(shutil.rmtree, _helper_cache, ignore_errors=True)

# Property tests are judged by their examples, not by how fast one runs: hypothesis's default
# 200 ms deadline per example failed a pure function's test on a loaded 2-core machine
# (265 ms while the suite's other lines ran), which checks nothing of the code.
hypothesis_settings.register_profile("suite", deadline=None)
hypothesis_settings.load_profile("suite")


@pytest.fixture(scope="session", autouse=True)
def _sandbox_root_of_the_run() -> Iterator[None]:
    """A test that reaches the runtime without a root of its own (an API call through a
    view that asks the host's capacity) gets this run's, under /tmp and torn down with the
    run, never the machine's default root (/var/lib/e2bfacade), where its daemons would
    outlive the suite and hold a block of the host's ids. scripts/test.sh gives its lines
    one such root (SANDBOX_ROOT), which it tears down itself."""
    if os.environ.get("SANDBOX_ROOT", "").startswith("/tmp/e2bd-"):
        yield
        return
    runs = session_sandbox_root("e2bd-")
    settings.SANDBOX_ROOT = next(runs)
    yield
    for _ in runs:
        pass


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
