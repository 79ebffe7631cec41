"""This host as the fleet sees it: its label and its advert (e2bfacade/fleet/membership.py).
Read without the fence: a host advertises itself to become a member, before it serves."""

from __future__ import annotations

from django.conf import settings

from e2bfacade.fleet import membership
from e2bfacade.sandbox_runtime import get_runtime
from nodes.selectors import local_node


def this_label() -> str:
    return local_node().label


def advert() -> membership.Advert:
    capacity = get_runtime().capacity()
    return membership.Advert(
        host_id=local_node().host_id,
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
