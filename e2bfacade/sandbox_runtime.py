"""Sandbox runtimes behind one interface (:mod:`e2bfacade.runtime.base`), chosen by
``SANDBOX_RUNTIME``. Only ``local`` exists in this build."""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings

from e2bfacade import failpoints, observability
from e2bfacade.runtime.base import Runtime

_lock = threading.Lock()
_runtimes: dict[str, Runtime] = {}


def get_runtime() -> Runtime:
    """The process's runtime for the configured ``SANDBOX_ROOT`` (built on first use, so a
    machine that cannot run sandboxes still serves everything else)."""
    key = f"{settings.SANDBOX_RUNTIME}:{settings.SANDBOX_ROOT}"
    with _lock:
        if key not in _runtimes:
            from e2bfacade.runtime.local import LocalRuntime

            # Always metered: every operation's duration goes to /metrics.
            runtime: Runtime = observability.metered(LocalRuntime)(settings.SANDBOX_ROOT)
            if failpoints.enabled("runtime."):
                runtime = FaultyRuntime(runtime)
            _runtimes[key] = runtime
        return _runtimes[key]


class FaultyRuntime:
    """The runtime with failpoints around every operation (tests only: built only when
    E2BFACADE_FAILPOINTS names a ``runtime.*`` point)."""

    def __init__(self, inner: Runtime) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            failpoints.failpoint(f"runtime.{name}.before")
            result = target(*args, **kwargs)
            failpoints.failpoint(f"runtime.{name}.after")
            return result

        return call
