"""pytest glue for the black-box suites that start their own live e2bfacade
(tests/retry, tests/faults, tests/fuzz, tests/soak): start one, and show the end of its log
beside a failing test's traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator

import pytest

from tests.support.live_server import (
    LiveServer,
    Server,
    ServerError,
    live_server,
    suite_database_url,
)

# The servers a suite started and that are still up: a failure report shows their logs.
running: list[LiveServer] = []


@contextlib.contextmanager
def started(workers: int = 4, **extra_env: str) -> Iterator[LiveServer]:
    """A live server on a fresh database of the suite's kind, with ``extra_env``."""
    try:
        with live_server(suite_database_url(), workers=workers, extra_env=extra_env) as server:
            running.append(server)
            try:
                yield server
            finally:
                running.remove(server)
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)


def point_sdk(env: pytest.MonkeyPatch, server: Server, api_key: str) -> None:
    """Point the unmodified E2B SDK at ``server`` as a user would, as ``scripts/serve.sh``
    prints it: the API, the data plane (single-URL mode, the sandbox named by header) and
    the team of ``api_key``. E2B_DEBUG stays unset: in debug mode the SDK skips the API."""
    for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
        env.delenv(name, raising=False)
    env.setenv("E2B_API_URL", server.url)
    env.setenv("E2B_SANDBOX_URL", server.sandbox_url)
    env.setenv("E2B_API_KEY", api_key)


def attach_log_tails(report: pytest.TestReport) -> None:
    if report.failed:
        for server in running:
            report.sections.append((f"e2bfacade log {server.url} (tail)", server.log_tail()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test shows the end of the logs of the servers ``started`` runs. A suite's
    conftest imports this hook: it then holds for that directory's tests only."""
    report = yield
    attach_log_tails(report)
    return report
