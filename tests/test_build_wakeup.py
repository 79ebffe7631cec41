"""An idle build worker is woken by a trigger's NOTIFY on PostgreSQL (not by polling), and
polls with a growing interval, at most IDLE_MAX_SECONDS, where it cannot listen."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from templates.builds import wakeup

pytestmark = pytest.mark.both_databases


@pytest.mark.django_db(transaction=True)
def test_an_announced_build_wakes_the_idle_worker_at_once() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite polls (the test below)")
    waiter = wakeup.Waiter()
    stop = threading.Event()
    try:
        waiter.idle(stop)  # connects and listens; returns after at most the poll interval
        woke: list[float] = []

        def wait() -> None:
            started = time.monotonic()
            waiter.idle(stop)
            woke.append(time.monotonic() - started)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        with transaction.atomic():
            wakeup.announce()  # sent at the commit, not before
        thread.join(timeout=5)
        assert woke and woke[0] < 0.2 + wakeup.IDLE_MAX_SECONDS / 2, woke
    finally:
        waiter.close()


def test_without_listen_the_idle_wait_grows_to_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    waiter = wakeup.Waiter()
    monkeypatch.setattr(waiter, "_listening", lambda: None)  # as on SQLite
    waited: list[float] = []
    stop = threading.Event()
    monkeypatch.setattr(stop, "wait", lambda seconds: waited.append(seconds))
    for _ in range(8):
        waiter.idle(stop)
    assert waited[0] == wakeup.IDLE_MIN_SECONDS
    assert waited == sorted(waited) and waited[-1] == wakeup.IDLE_MAX_SECONDS
    waiter.busy()
    waiter.idle(stop)
    assert waited[-1] == wakeup.IDLE_MIN_SECONDS
