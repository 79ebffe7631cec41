"""This host as the fleet sees it: its label and its advert (e2bfacade/fleet/membership.py).
Read without the fence: a host advertises itself to become a member, before it serves."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings

from e2bfacade.errors import ServiceUnavailable
from e2bfacade.fleet import host as fleet_host
from e2bfacade.fleet import membership
from e2bfacade.sandbox_runtime import get_runtime
from nodes.selectors import host_label, local_node


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


@dataclass(frozen=True)
class FleetNode:
    """A host of the fleet as the operator sees it: a live member of etcd (its status the
    operator's ``ready``/``draining``/``standby``), or a host that rows still name but whose
    key is gone (``unhealthy``: dead, cut off, or decommissioned with sandboxes left)."""

    label: str
    host_id: str
    status: str
    cpus: int
    memory_mb: int


def fleet_nodes(hosts_in_rows: Iterable[str]) -> list[FleetNode]:
    """Every member of the fleet, then every host in ``hosts_in_rows`` that is not one."""
    try:
        members = membership.members(fleet_host.etcd(), settings.FLEET_PREFIX)
    except membership.MembershipError as exc:
        raise ServiceUnavailable(
            f"the fleet's membership cannot be read: {exc}", error_code="fleet_unavailable"
        ) from None
    out = [
        FleetNode(
            label=label,
            host_id=advert.host_id,
            status=advert.state,
            cpus=int(advert.capacity.get("cpus", 0)),
            memory_mb=int(advert.capacity.get("memory_mb", 0)),
        )
        for label, advert, _ in members
    ]
    known = {node.host_id for node in out}
    for host_id in sorted(set(hosts_in_rows) - known):
        out.append(FleetNode(host_label(host_id), host_id, "unhealthy", 0, 0))
    return out


def fleet_set_status(label: str, status: str) -> None:
    """The operator's status for host ``label``, applied by its member within a third of
    its lease (``draining``/``standby``: the front sends it no creates, and it refuses any
    that reach it)."""
    try:
        membership.set_status(fleet_host.etcd(), settings.FLEET_PREFIX, label, status)
    except membership.MembershipError as exc:
        raise ServiceUnavailable(
            f"the fleet's membership cannot be written: {exc}", error_code="fleet_unavailable"
        ) from None
