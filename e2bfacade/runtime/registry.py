"""Drivers by name. ``SANDBOX_RUNTIME`` names one (``e2bfacade/sandbox_runtime.py`` builds
it for a ``SANDBOX_ROOT``). A driver is registered as ``"module:Class"`` so that naming it
here costs no import: a host without a driver's dependencies can still run the others.

A new driver (kubernetes via agent-sandbox, gvisor, ...) is one module exposing a class with
``name``, ``capabilities``, ``capabilities_for`` and the methods of :class:`.base.Runtime`
(its ``guest()`` returning a :class:`.guest.Guest`), one line here, and a passing run of
``tests/runtime/test_contract.py`` against it (docs/ARCHITECTURE.md, "Where new code goes").
"""

from __future__ import annotations

import importlib
from typing import cast

from e2bfacade.runtime.base import Runtime

DRIVERS: dict[str, str] = {
    "gvisor": "e2bfacade.runtime.gvisor.driver:GvisorRuntime",
    "local": "e2bfacade.runtime.local.driver:LocalRuntime",
}


def driver_names() -> list[str]:
    return sorted(DRIVERS)


def driver_class(name: str) -> type[Runtime]:
    """The class of the driver ``name`` (KeyError for an unknown name)."""
    module_name, _, class_name = DRIVERS[name].partition(":")
    return cast(type[Runtime], getattr(importlib.import_module(module_name), class_name))
