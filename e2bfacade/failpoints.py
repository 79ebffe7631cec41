"""Fault injection for the exactly-once tests, off unless the environment asks for it.

``E2BFACADE_FAILPOINTS`` is a comma-separated list of ``name`` (SIGKILL this process when it
reaches that point), ``name=sleep:SECONDS`` (stall there, to play a slow original) or
``name=error`` (raise :class:`InjectedFault` there, to play a failing runtime).
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

from sandboxes.runtime.base import RuntimeUnavailable


class InjectedFault(RuntimeUnavailable):
    """The failure a ``name=error`` failpoint raises: a runtime error like any other."""


def _parse(raw: str) -> dict[str, float | str | None]:
    points: dict[str, float | str | None] = {}
    for item in filter(None, raw.split(",")):
        name, _, action = item.partition("=")
        if action.startswith("sleep:"):
            points[name] = float(action.removeprefix("sleep:"))
        elif action == "error":
            points[name] = "error"
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
    if action == "error":
        raise InjectedFault(f"injected fault at {name}")
    if isinstance(action, float):
        time.sleep(action)
        return
    os.kill(os.getpid(), signal.SIGKILL)
