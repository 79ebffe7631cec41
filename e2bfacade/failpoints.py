"""Fault injection for the exactly-once tests, off unless the environment asks for it.

``E2BFACADE_FAILPOINTS`` is a comma-separated list of ``name`` (SIGKILL this process when it
reaches that point), ``name=sleep:SECONDS`` (stall there, to play a slow original) or
``name=error`` (raise there, to play a failing runtime: a refusal before a runtime
operation acted, :class:`InjectedRefusal`; an error of unknown outcome anywhere else,
:class:`InjectedFault`) or ``name=dbdrop`` (this process's database connection dies there:
on PostgreSQL its backend is terminated; elsewhere the driver's error is raised).
Points: ``after_claim``, ``after_runtime_create``, ``before_complete``, ``after_complete``,
and around every runtime operation ``runtime.<op>.before`` / ``runtime.<op>.after`` (e.g.
``runtime.pause.after=error``: the freeze happened, the caller is told it failed).
With ``E2BFACADE_FAILPOINT_DIR`` set, each point fires once: the first process to reach it
leaves a marker file there, so the retry gets through.
"""

from __future__ import annotations

import os
import signal
import time

from e2bfacade.runtime.base import CreateRefused, RuntimeBusy


class InjectedFault(RuntimeBusy):
    """What ``name=error`` raises after a runtime operation acted: a transient error whose
    outcome the caller cannot know."""


class InjectedRefusal(CreateRefused):
    """What ``runtime.<op>.before=error`` raises: the runtime refused before acting, so
    provably nothing was done."""


def _parse(raw: str) -> dict[str, float | str | None]:
    points: dict[str, float | str | None] = {}
    for item in filter(None, raw.split(",")):
        name, _, action = item.partition("=")
        if action.startswith("sleep:"):
            points[name] = float(action.removeprefix("sleep:"))
        elif action in ("error", "dbdrop"):
            points[name] = action
        elif action:
            raise ValueError(f"E2BFACADE_FAILPOINTS: unknown action {action!r} for {name}")
        else:
            points[name] = None
    return points


def enabled(prefix: str = "") -> bool:
    return any(name.startswith(prefix) for name in _POINTS)


_POINTS = _parse(os.environ.get("E2BFACADE_FAILPOINTS", ""))


def failpoint(name: str) -> None:
    if name not in _POINTS:
        return
    marker_dir = os.environ.get("E2BFACADE_FAILPOINT_DIR")
    if marker_dir:
        try:
            fd = os.open(os.path.join(marker_dir, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # already fired once
        os.close(fd)
    action = _POINTS[name]
    if action == "dbdrop":
        _drop_database_connection()
    if action == "error":
        if name.endswith(".before"):
            raise InjectedRefusal(f"injected refusal at {name}")
        raise InjectedFault(f"injected fault at {name}")
    if isinstance(action, float):
        time.sleep(action)
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _drop_database_connection() -> None:
    from django.db import OperationalError, connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # raises: the backend ends under the statement
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    raise OperationalError("injected: the database connection was lost")
