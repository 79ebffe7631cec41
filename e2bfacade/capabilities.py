"""What the configured sandbox driver can do, as request validation needs it.

The driver declares its capabilities (``e2bfacade.runtime.base.Capability``); a request
field that needs one the driver lacks is refused with a 400 naming the field and saying
why, never accepted and silently ignored. Read from the driver's class, so validation
needs no running runtime (and no root).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from e2bfacade.runtime import registry
from e2bfacade.runtime.base import Capability

# What each capability is, as a refusal puts it: "<what> is not supported by ...".
WHAT = {
    Capability.INTERNET_ACCESS: "internet access (networking is off, SANDBOX_UPLINK=none: "
    "sandboxes have their own loopback only; send false)",
    Capability.NETWORK_RULES: "network rules",
    Capability.FILESYSTEM_PAUSE: "filesystem-only pause (a pause is a freeze, which keeps memory)",
    Capability.REBOOT_ON_RESUME: "reboot on resume (a resume always restores memory)",
    Capability.MEMORY_SNAPSHOTS: "memory snapshots (snapshots capture files only; omit it or "
    "send false)",
    Capability.VOLUME_MOUNTS: "volumes",
    Capability.DISK_QUOTA: "a disk size limit",
    Capability.PROCESSES: "running processes",
    Capability.PTY: "terminals",
    Capability.FILES: "file operations",
}


def supported() -> frozenset[Capability]:
    driver = registry.driver_class(settings.SANDBOX_RUNTIME)
    return driver.capabilities_for(settings.SANDBOX_RUNTIME_OPTIONS)


def refusal(capability: Capability) -> str | None:
    """None when the driver has ``capability``, else the message that refuses it."""
    if capability in supported():
        return None
    return f"{WHAT[capability]} is not supported by the {settings.SANDBOX_RUNTIME!r} runtime"


def refusals(needed: dict[str, tuple[bool, Capability]]) -> dict[str, list[str]]:
    """``{field: (asked for it, capability it needs)}`` → DRF errors for the fields the
    driver cannot honour."""
    errors = {}
    for name, (asked, capability) in needed.items():
        message = refusal(capability) if asked else None
        if message:
            errors[name] = [message]
    return errors


class CapabilityCollector(Collector):
    """``e2bfacade_runtime_capability{driver, capability}``: 1 for what the host's driver
    can do, 0 for what it cannot (which driver keeps memory: ``memory_snapshots``)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "e2bfacade_runtime_capability",
            "What the host's sandbox driver can do (1) or cannot (0)",
            labels=["driver", "capability"],
        )
        have = supported()
        for capability in Capability:
            gauge.add_metric([settings.SANDBOX_RUNTIME, capability.value], int(capability in have))
        yield gauge
