"""Fixtures of the template tests: loopback registries (tests/support/registry.py) seeded
with this service's Debian bases from the cache (never downloaded here: a missing cache is
a skip that names the command that fills it), and a local runtime on a scratch root."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from e2bfacade.runtime.local import LocalRuntime
from templates.builds import debian
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.support.registry import loopback_registry

# The credentials of the registry that demands them (made up for the test, never used
# elsewhere): distinctive, so that a search of argv and logs for them cannot miss.
REGISTRY_USER = "e2b-puller"
REGISTRY_PASSWORD = "s3cret-Pa55-7f1c9e"


def _seed(url: str, **kwargs: object) -> None:
    try:
        debian.seed(url, cache_dir=settings.TEMPLATE_CACHE_DIR / "bases", offline=True, **kwargs)  # type: ignore[arg-type]
    except debian.BaseNotCached as exc:
        # The suite (scripts/test.sh) builds the cache first: there, a missing one fails.
        if os.environ.get("E2BFACADE_REQUIRE_TEMPLATE_BASES"):
            pytest.fail(exc.message, pytrace=False)
        pytest.skip(exc.message)


@pytest.fixture(scope="session")
def registry_url() -> Iterator[str]:
    """A plain-HTTP registry on loopback holding library/debian:bookworm (and :12),
    e2bdev/base:latest and the library/ubuntu:22.04 substitute."""
    with tempfile.TemporaryDirectory(prefix="e2bt-registry-") as storage:
        with loopback_registry(Path(storage)) as url:
            _seed(url, ubuntu_substitute=True)
            yield url


@pytest.fixture(scope="session")
def private_registry_url() -> Iterator[str]:
    """A registry that demands REGISTRY_USER's password of every request, seeded with
    library/debian:bookworm only."""
    from templates.builds.registry import RegistryAuth

    auth = RegistryAuth(REGISTRY_USER, REGISTRY_PASSWORD)
    with tempfile.TemporaryDirectory(prefix="e2bt-registry-") as storage:
        with loopback_registry(Path(storage), users={REGISTRY_USER: REGISTRY_PASSWORD}) as url:
            _seed(url, recipes=(debian.DEBIAN_BOOKWORM,), auth=auth)
            yield url


@pytest.fixture
def pull_cache() -> Iterator[Path]:
    """A fresh, empty pull cache (a test that wants a warm one uses ``shared_pull_cache``)."""
    with tempfile.TemporaryDirectory(prefix="e2bt-pulls-") as path:
        yield Path(path)


@pytest.fixture(scope="session")
def shared_pull_cache() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="e2bt-pulls-") as path:
        yield Path(path)


@pytest.fixture(scope="module")
def local_runtime() -> Iterator[LocalRuntime]:
    rt = make_runtime()
    yield rt
    destroy_runtime(rt)
