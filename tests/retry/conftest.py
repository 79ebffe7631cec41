"""The retry table (docs/idempotency.md, "Retry table") proven against a real running
e2bfacade: gunicorn with 4 workers and the lifecycle worker, its own database and sandbox
root, raw HTTP."""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.support.live_fixtures import attach_log_tails, started
from tests.support.live_server import LiveServer


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    # No rate limit: a module sends a few thousand requests as one team.
    with started(API_RATE_LIMIT="0") as live:
        yield live


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    attach_log_tails(report)
    return report
