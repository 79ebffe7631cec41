"""Cleanup fixtures of the suites that drive a live server over HTTP (a pytest plugin,
registered by tests/conftest.py): what a test made through the API is deleted through the
API at teardown, whether the test got that far or not.

A suite that uses them names its server with a ``cleanup_server`` fixture, and may name
what it asserts of each cleanup's answer with ``cleanup_check`` (by default nothing: a 404
is fine, the test may have deleted it itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.support import live_checks as lc
from tests.support.live_server import LiveServer

Register = Callable[[str], str]
Check = Callable[[httpx.Response], object]


@pytest.fixture
def cleanup_check() -> Check:
    """What a suite asserts of each cleanup's answer: nothing, unless it says otherwise."""
    return lambda response: response


def _deleted_at_teardown(
    server: LiveServer, check: Check, path: Callable[[str], str]
) -> Iterator[Register]:
    made: list[str] = []

    def register(name: str) -> str:
        made.append(name)
        return name

    yield register
    with lc.client(server) as client:
        for name in made:
            check(client.delete(path(name)))


@pytest.fixture
def delete_template_later(cleanup_server: LiveServer, cleanup_check: Check) -> Iterator[Register]:
    """Register a template or snapshot to delete at teardown, after the test's sandboxes are
    killed (``kill_later`` depends on this fixture, so it is torn down first)."""
    yield from _deleted_at_teardown(
        cleanup_server, cleanup_check, lambda ref: f"/templates/{quote(ref, safe='')}"
    )


@pytest.fixture
def kill_later(
    cleanup_server: LiveServer, cleanup_check: Check, delete_template_later: Register
) -> Iterator[Register]:
    """Register a sandbox id to kill at teardown."""
    yield from _deleted_at_teardown(
        cleanup_server, cleanup_check, lambda sandbox_id: f"/sandboxes/{sandbox_id}"
    )
