"""The suite's waiting helpers (tests/support/waiting.py) fail as they say they do."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.waiting import eventually, eventually_async, stays


def test_eventually_returns_the_first_value_that_holds() -> None:
    counter = itertools.count()
    assert eventually(lambda: next(counter), until=lambda n: n >= 3, within=5, what="3") == 3


def test_eventually_names_what_it_awaited_and_the_last_value_seen() -> None:
    with pytest.raises(AssertionError, match=r"waited 0.2 s for the answer; last seen: \[7\]"):
        eventually(lambda: [7], until=lambda v: v == [8], within=0.2, what="the answer")


def test_eventually_counts_an_ignored_exception_as_not_yet() -> None:
    calls = itertools.count()

    def flaky() -> int:
        if next(calls) < 2:
            raise ConnectionRefusedError("not yet")
        return 1

    assert eventually(flaky, within=5, what="up", ignoring=(ConnectionRefusedError,)) == 1
    with pytest.raises(AssertionError, match="raised ConnectionRefusedError"):
        eventually(flaky_forever, within=0.1, what="up", ignoring=(ConnectionRefusedError,))


def flaky_forever() -> int:
    raise ConnectionRefusedError("never")


def test_stays_fails_the_moment_the_event_happens() -> None:
    counter = itertools.count()
    with pytest.raises(AssertionError, match="the counter past 2 happened within 5 s: 3"):
        stays(lambda: (n := next(counter)) > 2 and n, for_=5, what="the counter past 2")


def test_stays_passes_when_nothing_happens_for_its_whole_window() -> None:
    calls = itertools.count()
    stays(lambda: next(calls) < 0, for_=0.2, every=0.01, what="nothing")
    assert next(calls) > 5  # it kept looking for the whole window


def test_eventually_async_awaits_its_probe_and_fails_as_eventually_does() -> None:
    counter = itertools.count()

    async def probe() -> int:
        return next(counter)

    async def scenario() -> None:
        assert await eventually_async(probe, until=lambda n: n >= 3, within=5, what="3") == 3
        with pytest.raises(AssertionError, match=r"waited 0.1 s for -1; last seen: \d+"):
            await eventually_async(probe, until=lambda n: n < 0, within=0.1, what="-1")

    asyncio.run(scenario())
