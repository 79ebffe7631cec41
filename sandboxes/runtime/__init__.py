"""Sandbox runtimes behind one interface (:mod:`sandboxes.runtime.base`), chosen by
``SANDBOX_RUNTIME``. Only ``local`` exists in this build."""

from __future__ import annotations

import threading

from django.conf import settings

from sandboxes.runtime.base import Runtime

_lock = threading.Lock()
_runtimes: dict[str, Runtime] = {}


def get_runtime() -> Runtime:
    """The process's runtime for the configured ``SANDBOX_ROOT`` (built on first use, so a
    machine that cannot run sandboxes still serves everything else)."""
    key = f"{settings.SANDBOX_RUNTIME}:{settings.SANDBOX_ROOT}"
    with _lock:
        if key not in _runtimes:
            from sandboxes.runtime.local import LocalRuntime

            _runtimes[key] = LocalRuntime(settings.SANDBOX_ROOT)
        return _runtimes[key]
