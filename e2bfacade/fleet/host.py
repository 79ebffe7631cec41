"""This host's standing in its fleet, read from what its member last wrote
(e2bfacade/fleet/membership.py, "Fence"): whether it may serve sandbox work, and whether it
takes new sandboxes. A fleet of one always serves and always takes them. Read by the nodes
seam before any runtime work and by the readiness probes, so a fenced host neither acts on
sandboxes nor receives the front's traffic, and a draining one gets no creates."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from etcd3gw.client import Etcd3Client

from e2bfacade.errors import ServiceUnavailable
from e2bfacade.fleet import membership


def state_dir() -> Path:
    """Where this host's membership keeps its lease id and its fence."""
    return Path(settings.SANDBOX_ROOT) / "fleet"


def etcd() -> list[Etcd3Client]:
    """Clients of the fleet's etcd endpoints (``ETCD_ENDPOINTS``), in order."""
    return membership.clients(settings.ETCD_ENDPOINTS, timeout=2.0)


def _fence() -> membership.Fence | None:
    return membership.read_fence(state_dir())


def serving() -> bool:
    if not settings.ETCD_ENDPOINTS:
        return True
    fence = _fence()
    return fence is not None and fence.holds()


def state() -> str:
    """The operator's state for this host: ``ready`` unless it was set ``draining`` or
    ``standby`` (``POST /nodes/{id}``)."""
    if not settings.ETCD_ENDPOINTS:
        return "ready"
    fence = _fence()
    return fence.state if fence is not None else "ready"


def check_serving() -> None:
    """Raise the 503 a fenced host answers: it cannot prove to the fleet that it is alive
    (etcd or the database out of its reach), so the fleet may be giving its sandboxes up."""
    if not serving():
        raise ServiceUnavailable(
            "this host is cut off from the fleet (etcd or the database) and serves no "
            "sandbox work until it is back; retry through the front",
            error_code="host_fenced",
            headers={"Should-Retry": "true"},
        )


def check_placeable() -> None:
    """Raise the 503 a host that takes no new sandboxes answers to a create."""
    check_serving()
    if state() != "ready":
        raise ServiceUnavailable(
            f"this host is {state()} and takes no new sandboxes; create through the front, "
            "which sends creates to the hosts that take them",
            error_code="host_not_placeable",
            headers={"Should-Retry": "true"},
        )
