from __future__ import annotations

# A failing test shows the end of its live server's log.
from tests.support.live_fixtures import pytest_runtest_makereport  # noqa: F401 - the hook
