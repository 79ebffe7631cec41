from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.support.live_fixtures import attach_log_tails


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    attach_log_tails(report)
    return report
