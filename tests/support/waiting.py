"""Waiting in tests: the suite's one bounded poll for an event (``eventually``) and one for
an absence (``stays``).

A test waits for an event by polling for it with a bound, never by sleeping a guessed
time; on a loaded 2-core machine a bound is a ceiling that a passing run never reaches, so
it may be generous. A failure names what was awaited and the last value seen, so a timeout
reads as a finding rather than ``assert False``.

That something did *not* happen is proved first by an event that had to happen after it
(a later request answered, a log line, a counter moved past it); where no such event
exists, ``stays`` polls the condition for a bounded time and fails the moment it turns true.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

STEP_SECONDS = 0.05
SHOWN_CHARS = 600  # of the last value seen, in a failure message


def _shown(value: object) -> str:
    """``value``'s repr, its start and its end when long (a log's news is at its end)."""
    text = repr(value)
    half = SHOWN_CHARS // 2
    return text if len(text) <= SHOWN_CHARS else f"{text[:half]} … {text[-half:]}"


def eventually(
    probe: Callable[[], T],
    *,
    within: float,
    what: str,
    until: Callable[[T], object] = bool,
    every: float = STEP_SECONDS,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``probe`` every ``every`` seconds until ``until(value)`` holds (by default: the
    value is truthy) and return that value. Past ``within`` seconds — the probe is always
    called once more at the bound — fail with an AssertionError naming ``what`` was awaited
    and the last value seen. An exception of a type in ``ignoring`` counts as "not yet" (a
    server not listening yet) and is shown as the last value."""
    deadline = time.monotonic() + within
    while True:
        try:
            value = probe()
        except ignoring as exc:
            last = f"raised {exc!r}"
        else:
            if until(value):
                return value
            last = _shown(value)
        time.sleep(_pause(deadline, every, within, what, last))


async def eventually_async(
    probe: Callable[[], Awaitable[T]],
    *,
    within: float,
    what: str,
    until: Callable[[T], object] = bool,
    every: float = STEP_SECONDS,
) -> T:
    """``eventually`` for a coroutine test: awaits ``probe`` and sleeps without blocking the
    event loop (whose callbacks may be what the test waits for)."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if until(value):
            return value
        await asyncio.sleep(_pause(deadline, every, within, what, _shown(value)))


def _pause(deadline: float, every: float, within: float, what: str, last: str) -> float:
    """How long to sleep before the next try; past the bound, the failure."""
    now = time.monotonic()
    if now >= deadline:
        raise AssertionError(f"waited {within:g} s for {what}; last seen: {last}")
    return min(every, deadline - now)


def stays(
    happened: Callable[[], object],
    *,
    for_: float,
    what: str,
    every: float = STEP_SECONDS,
) -> None:
    """Call ``happened`` every ``every`` seconds for ``for_`` seconds and fail the moment it
    returns something truthy: ``what`` names the event that must not happen. The bounded
    poll for an absence with no later event to wait for instead."""
    deadline = time.monotonic() + for_
    while True:
        value = happened()
        if value:
            raise AssertionError(f"{what} happened within {for_:g} s: {_shown(value)}")
        if time.monotonic() >= deadline:
            return
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))
