"""Drivers by name, and the only place a driver is chosen: ``SANDBOX_RUNTIME`` names one
(``e2bfacade/sandbox_runtime.py`` builds it for a ``SANDBOX_ROOT``), and a root torn down is
opened by the driver that made it (:func:`drivers_for_root`). A driver is registered as
``"module:Class"`` so that naming it here costs no import: a host without a driver's
dependencies can still run the others.

A driver on this host's runtime is a sandboxer (e2bfacade/runtime/local/sandboxer.py) paired
with the host runtime (e2bfacade/runtime/local/driver.py: ``LocalRuntime`` and
``GvisorRuntime`` are such pairs); another kind of driver (kubernetes via agent-sandbox, ...)
is one module exposing a class with ``name``, ``capabilities``, ``capabilities_for`` and the
methods of :class:`.base.Runtime` (its ``guest()`` returning a :class:`.guest.Guest`). Either
way: one line here, and a passing run of ``tests/runtime/test_contract.py`` against it
(docs/ARCHITECTURE.md, "Where new code goes").
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, cast

from e2bfacade.runtime.base import Runtime

if TYPE_CHECKING:
    from e2bfacade.runtime.local.driver import HostRuntime

DRIVERS: dict[str, str] = {
    "gvisor": "e2bfacade.runtime.gvisor.driver:GvisorRuntime",
    "local": "e2bfacade.runtime.local.driver:LocalRuntime",
}
# The drivers on the host runtime, and the one every root of it can be opened with (its
# sandboxes' processes end with their groups, whichever sandboxer started them).
HOST_DRIVERS = ("gvisor", "local")
HOST_FALLBACK = "local"


def driver_names() -> list[str]:
    return sorted(DRIVERS)


def _load(name: str) -> object:
    module_name, _, class_name = DRIVERS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def driver_class(name: str) -> type[Runtime]:
    """The class of the driver ``name`` (KeyError for an unknown name)."""
    return cast(type[Runtime], _load(name))


def host_driver_class(name: str) -> type[HostRuntime]:
    """The class of the host-runtime driver ``name`` (KeyError for another)."""
    if name not in HOST_DRIVERS:
        raise KeyError(name)
    return cast("type[HostRuntime]", _load(name))


def drivers_for_root(root: Path) -> list[str]:
    """The host-runtime drivers that may open ``root`` to end its sandboxes, best first:
    the one whose sandboxer keeps its state in the root (Sandboxer.state_dir: gVisor's
    runsc), which made it; then the fallback, for a root whose sandboxer cannot run any
    more (runsc gone)."""
    made = [
        name
        for name in HOST_DRIVERS
        if (state := host_driver_class(name).sandboxer_class.state_dir) is not None
        and (root / state).is_dir()
    ]
    return [*made, HOST_FALLBACK]
