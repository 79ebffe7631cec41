"""What the retry table's modules left behind, judged after all of them (conftest.py orders
this module last)."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.retry.support import pause
from tests.support import live_checks as lc
from tests.support.live_server import LiveServer


def test_the_retry_table_leaked_nothing_and_never_answered_5xx(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    """Runs last: every sandbox the retry tests made was killed by their teardown, so the
    runtime holds exactly what the API lists as live (here: one running, one paused), and
    the database agrees with both."""
    running, paused = new_sandbox(), new_sandbox()
    pause(http, paused)
    assert lc.api_live(http) == {running: "running", paused: "paused"}
    assert lc.runtime_states(server) == lc.api_live(http)
    assert lc.disagreements(server) == []
    assert lc.access_log_5xx(server.log_path) == []
