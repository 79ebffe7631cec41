"""How a build worker learns that a build is waiting, without asking the database ten
times a second: on PostgreSQL the trigger sends ``NOTIFY`` after its commit and the idle
worker waits on ``LISTEN`` (woken at once); on SQLite, or while the listening connection is
down, the worker polls, quickly after work and more slowly the longer it stays idle.

Either way an idle worker asks for a claim at least every ``IDLE_MAX_SECONDS``: a build
whose worker died is claimable only once its lease runs out, and nobody announces that.
(Polling every 0.1 s, each live server's idle worker was the suite's third-largest user of
CPU, after pytest and gunicorn.)
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import connection, transaction

from e2bfacade.listening import Listener

logger = logging.getLogger("e2bfacade.builds")
CHANNEL = "e2bfacade_template_builds"
IDLE_MIN_SECONDS = 0.1
IDLE_MAX_SECONDS = 1.0


def announce() -> None:
    """After the current transaction commits: wake the idle build workers (PostgreSQL)."""
    if connection.vendor == "postgresql":
        transaction.on_commit(_notify)


def _notify() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}")
    except Exception:  # noqa: BLE001 - the workers find the build on their next poll
        logger.warning("could not wake the build workers", exc_info=True)


class Waiter:
    """One worker thread's idle wait. ``idle(stop)`` returns when a build was announced,
    the poll interval passed or ``stop`` was set; ``busy()`` after a build ran."""

    def __init__(self) -> None:
        self._listener = Listener(CHANNEL)
        self._interval = IDLE_MIN_SECONDS

    def busy(self) -> None:
        self._interval = IDLE_MIN_SECONDS

    def idle(self, stop: threading.Event) -> None:
        listening = self._listening()
        if listening is None:
            stop.wait(self._interval)
            self._interval = min(IDLE_MAX_SECONDS, self._interval * 2)
            return
        try:
            for _ in listening.notifies(timeout=IDLE_MAX_SECONDS, stop_after=1):
                pass
        except Exception:  # noqa: BLE001 - the database went away: poll until it is back
            logger.warning("build workers' LISTEN connection lost; polling", exc_info=True)
            self.close()
            stop.wait(self._interval)

    def _listening(self) -> Any:
        if connection.vendor != "postgresql":
            return None
        try:
            return self._listener.connection()
        except Exception:  # noqa: BLE001 - poll instead, and try again next time
            logger.warning("build workers cannot LISTEN; polling", exc_info=True)
            return None

    def close(self) -> None:
        self._listener.close()
