"""The front's map kept from the truth: which host holds each sandbox, read from the
database, written into HAProxy (e2bfacade/fleet/haproxy.py) by one syncer per front
(``manage.py run_front_sync``).

The map's values are hosts' labels (``nodes.selectors.host_label``), the names of the
front's backends: ``<label>-api`` and ``<label>-sandbox`` (docs/fleet.md). A sandbox is in
the map from its create until it is killed; a row without a host predates hosts, and is
left to the front's default (any host, which is then the only one).

Changes reach the syncer by ``LISTEN``: a trigger on the sandbox table (migration
``sandboxes/migrations/0011_sandbox_route_notify.py``) announces every insert, host change,
kill and delete after its commit. A full resynchronisation runs at start, after the
listening connection was lost, and every ``--resync`` seconds whatever happens: a missed
notification costs at most that long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from django.db import close_old_connections, connection

from e2bfacade.fleet.haproxy import Front
from e2bfacade.listening import Listener
from nodes.selectors import host_label
from sandboxes.models import Sandbox

log = logging.getLogger("e2bfacade.fleet")
CHANNEL = "e2bfacade_sandbox_routes"


def routes(sandbox_ids: Iterable[str] | None = None) -> dict[str, str]:
    """``sandbox id -> host label`` for the sandboxes a host holds (all, or ``sandbox_ids``
    among them)."""
    rows = Sandbox.objects.exclude(state=Sandbox.State.KILLED).exclude(host="")
    if sandbox_ids is not None:
        rows = rows.filter(sandbox_id__in=list(sandbox_ids))
    return {sid: host_label(host) for sid, host in rows.values_list("sandbox_id", "host")}


class Syncer:
    """Keeps one front's map equal to :func:`routes`."""

    def __init__(self, front: Front, resync_seconds: float) -> None:
        self.front = front
        self.resync_seconds = resync_seconds
        self.current: dict[str, str] = {}
        self._listener = Listener(CHANNEL)

    def resync(self) -> int:
        """Replace the whole map with the truth; returns its size."""
        close_old_connections()
        self.current = routes()
        self.front.replace(self.current)
        return len(self.current)

    def apply(self, sandbox_ids: set[str]) -> None:
        """Route the announced sandboxes as their rows say now."""
        close_old_connections()
        now = routes(sandbox_ids)
        changed = {sid: label for sid, label in now.items() if self.current.get(sid) != label}
        removed = [sid for sid in sandbox_ids if sid not in now and sid in self.current]
        if not changed and not removed:
            return
        self.front.update(changed, removed)
        self.current.update(changed)
        for sid in removed:
            self.current.pop(sid, None)
        self.front.write_file(self.current)

    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: resync, then apply what is announced; resync again every
        ``resync_seconds`` and after any failure (the database or HAProxy away: retried
        each second)."""
        due = 0.0
        while not stop.is_set():
            try:
                listening = (
                    self._listener.connection() if connection.vendor == "postgresql" else None
                )
                if time.monotonic() >= due:
                    size = self.resync()
                    log.info("front map resynchronised: %d sandboxes", size)
                    due = time.monotonic() + self.resync_seconds
                if listening is None:  # SQLite: one host, no fleet; resync only
                    stop.wait(min(1.0, self.resync_seconds))
                    continue
                announced: set[str] = set()
                for notify in listening.notifies(timeout=1.0, stop_after=1):
                    announced.add(notify.payload)
                # Whatever else arrived meanwhile, in the same pass.
                for notify in listening.notifies(timeout=0.0):
                    announced.add(notify.payload)
                if announced:
                    self.apply(announced)
            except Exception as exc:  # noqa: BLE001 - HAProxy or the database away: retried
                log.warning("front sync: %s; resynchronising in 1 s", exc)
                self.close()
                due = 0.0
                stop.wait(1.0)
        self.close()

    def close(self) -> None:
        self._listener.close()
