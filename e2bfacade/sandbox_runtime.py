"""The Django side of the runtime seam: the process's driver, chosen from
:mod:`e2bfacade.runtime.registry` by ``SANDBOX_RUNTIME`` for ``SANDBOX_ROOT``, metered for
/metrics and, in tests, wrapped in failpoints. Every app reaches sandboxes through
:func:`get_runtime` and the interface in :mod:`e2bfacade.runtime.base`, never a driver."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from e2bfacade import failpoints, observability
from e2bfacade.runtime import registry
from e2bfacade.runtime.base import Capability, Runtime, RuntimeUnavailable

_lock = threading.Lock()
_runtimes: dict[str, Runtime] = {}


def get_runtime() -> Runtime:
    """The process's runtime for the configured ``SANDBOX_ROOT`` (built on first use, so a
    machine that cannot run sandboxes still serves everything else)."""
    key = f"{settings.SANDBOX_RUNTIME}:{settings.SANDBOX_ROOT}"
    with _lock:
        if key not in _runtimes:
            # Always metered: every operation's duration goes to /metrics.
            driver = registry.driver_class(settings.SANDBOX_RUNTIME)
            try:
                runtime: Runtime = observability.metered(driver)(
                    settings.SANDBOX_ROOT, **settings.SANDBOX_RUNTIME_OPTIONS
                )
            except OSError as exc:
                # A root it cannot make or use: the runtime's own refusal, which every
                # caller answers (503), never an unexplained 500.
                raise RuntimeUnavailable(f"the sandbox runtime cannot start: {exc}") from exc
            if failpoints.enabled("runtime."):
                runtime = FaultyRuntime(runtime)
            _runtimes[key] = runtime
        return _runtimes[key]


class FaultyRuntime:
    """The runtime with failpoints around every operation (tests only: built only when
    E2BFACADE_FAILPOINTS names a ``runtime.*`` point)."""

    def __init__(self, inner: Runtime) -> None:
        self._inner = inner

    @classmethod
    def capabilities_for(cls, options: Mapping[str, object]) -> frozenset[Capability]:
        raise TypeError("ask the driver's class (e2bfacade.capabilities), not this wrapper")

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
