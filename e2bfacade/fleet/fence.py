"""Whether this host may serve sandbox work now (e2bfacade/fleet/membership.py, "Fence"):
always for a fleet of one; in a fleet, only while its member's fence holds. Read by the
nodes seam before any runtime work and by the readiness probe, so a fenced host neither
acts on sandboxes nor receives the front's traffic."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from e2bfacade.errors import ServiceUnavailable
from e2bfacade.fleet import membership


def state_dir() -> Path:
    """Where this host's membership keeps its lease id and its fence."""
    return Path(settings.SANDBOX_ROOT) / "fleet"


def serving() -> bool:
    if not settings.ETCD_ENDPOINTS:
        return True
    fence = membership.read_fence(state_dir())
    return fence is not None and fence.holds()


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
