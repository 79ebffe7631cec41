"""Fault injection for the exactly-once tests, off unless the environment asks for it.

``E2BFACADE_FAILPOINTS`` is a comma-separated list of ``name`` (SIGKILL this process when it
reaches that point) or ``name=sleep:SECONDS`` (stall there, to play a slow original).
Points: ``after_claim``, ``after_runtime_create``, ``before_complete``, ``after_complete``.
With ``E2BFACADE_FAILPOINT_DIR`` set, each point fires once: the first process to reach it
leaves a marker file there, so the retry gets through.
"""

from __future__ import annotations

import os
import signal
import time


def _parse(raw: str) -> dict[str, float | None]:
    points: dict[str, float | None] = {}
    for item in filter(None, raw.split(",")):
        name, _, action = item.partition("=")
        if action.startswith("sleep:"):
            points[name] = float(action.removeprefix("sleep:"))
        elif action:
            raise ValueError(f"E2BFACADE_FAILPOINTS: unknown action {action!r} for {name}")
        else:
            points[name] = None
    return points


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
    delay = _POINTS[name]
    if delay is not None:
        time.sleep(delay)
        return
    os.kill(os.getpid(), signal.SIGKILL)
