"""A connection of its own that ``LISTEN``s on a PostgreSQL channel, for the processes that
wait on ``NOTIFY`` (the build workers, templates/builds/wakeup.py; the front's map syncer,
sandboxes/routes.py): opened apart from Django's, in autocommit, so that a notification
arrives whenever it is sent, and closed without raising once the database dropped it."""

from __future__ import annotations

from typing import Any

from django.db import connection


class Listener:
    """The channel's listening connection, opened on demand and again after a loss."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._conn: Any = None

    def connection(self) -> Any:
        """The open listening connection (psycopg's, with ``notifies()``); raises what the
        driver raises when the database cannot be reached."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        conn = connection.get_new_connection(connection.get_connection_params())
        conn.autocommit = True
        conn.execute(f"LISTEN {self.channel}")
        self._conn = conn
        return conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._conn = None
