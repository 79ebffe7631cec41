"""This host as the fleet sees it: its label, its advert, where its membership keeps its
state (e2bfacade/fleet/membership.py), and whether its fence lets it serve sandbox work."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from e2bfacade.fleet import membership
from e2bfacade.sandbox_runtime import get_runtime
from sandboxes.transitions import host_label, this_host


def state_dir() -> Path:
    return settings.SANDBOX_ROOT / "fleet"


def this_label() -> str:
    return host_label(this_host())


def advert() -> membership.Advert:
    capacity = get_runtime().capacity()
    return membership.Advert(
        host_id=this_host(),
        name=settings.FLEET_HOST_NAME,
        api_url=settings.FLEET_API_URL,
        sandbox_url=settings.FLEET_SANDBOX_URL,
        state="ready",
        capacity={
            "cpus": capacity.cpus,
            "memory_mb": capacity.memory_mb,
            "disk_mb": capacity.disk_mb,
            "pids": capacity.pids,
        },
        labels={},
    )


def serving() -> bool:
    """Whether this host may serve sandbox work now: always for a fleet of one; in a fleet,
    only while its member's fence holds."""
    if not settings.ETCD_ENDPOINTS:
        return True
    fence = membership.read_fence(state_dir())
    return fence is not None and fence.holds()
