"""Crash injection for the exactly-once tests, off unless the environment asks for it.

``E2BFACADE_FAILPOINTS=name[,name...]`` makes the process SIGKILL itself when it reaches a
named point (``after_claim``, ``after_runtime_create``, ``before_complete``,
``after_complete``). With ``E2BFACADE_FAILPOINT_DIR`` set, each point fires once: the first
process to reach it leaves a marker file there, so the retry gets through.
"""

from __future__ import annotations

import os
import signal

_ENABLED = frozenset(filter(None, os.environ.get("E2BFACADE_FAILPOINTS", "").split(",")))


def failpoint(name: str) -> None:
    if name not in _ENABLED:
        return
    marker_dir = os.environ.get("E2BFACADE_FAILPOINT_DIR")
    if marker_dir:
        try:
            fd = os.open(os.path.join(marker_dir, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # already fired once
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
