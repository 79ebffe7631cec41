"""What the operator does to sandboxes across a team or the host (E2B's admin routes, and
the admin site's actions): kill a team's sandboxes, count the running ones per team, and
E2B's ``/nodes`` view of the hosts.

A node is a host holding sandboxes, its id the opaque label tenants see in messages, never
its machine name or root. In a fleet (docs/fleet.md) ``/nodes`` lists the members of etcd
and the hosts rows still name, and a status change is the operator's ``ready``,
``draining`` or ``standby``. A single host's ``/nodes`` lists that one, always ``ready``; a
status change other than ``ready`` is refused with a 400 saying why (draining or parking
the only host would only refuse every create: moving sandboxes off a host needs several)."""

from __future__ import annotations

import logging
import os
import platform
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Q, Sum

from e2bfacade.errors import ApiError, BadRequest, NotFound
from e2bfacade.fleet import membership
from e2bfacade.models import Team
from nodes.fleet import FleetNode, fleet_nodes, fleet_set_status
from nodes.selectors import local_node, node_capacity
from sandboxes.models import Sandbox
from sandboxes.services import sandbox_kill

NODE_STATUSES = ("ready", "draining", "connecting", "unhealthy", "standby")

logger = logging.getLogger(__name__)


def sandbox_kill_team(*, team: Team) -> tuple[int, int]:
    """Kill every sandbox of ``team`` that is not killed yet, one by one through the same
    kill as ``DELETE /sandboxes/{id}`` (no lock is held across the runtime's kills).
    Returns (killed, failed). A sandbox another caller killed meanwhile is neither; one the
    runtime could not kill yet counts as failed (the worker re-drives it, and a repeat of
    this call tries it again). Safe to repeat: a repeat kills what is left."""
    killed = failed = 0
    ids = list(
        Sandbox.objects.filter(team=team)
        .exclude(state=Sandbox.State.KILLED)
        .values_list("sandbox_id", flat=True)
    )
    for sandbox_id in ids:
        try:
            sandbox_kill(team=team, sandbox_id=sandbox_id)
        except NotFound:
            continue  # killed by someone else since the list was read
        except ApiError as exc:
            logger.warning("kill of %s for the operator failed: %s", sandbox_id, exc.message)
            failed += 1
        else:
            killed += 1
    return killed, failed


def running_counts() -> dict[str, int]:
    """Running sandboxes per team, by E2B's ``teamID`` (teams with none are left out). One
    grouped query, read at each call."""
    rows = (
        Sandbox.objects.filter(state=Sandbox.State.RUNNING)
        .values("team_id")
        .annotate(n=Count("pk"))
        .order_by("team_id")
    )
    return {str(row["team_id"]): int(row["n"]) for row in rows}


def node_list() -> list[dict[str, Any]]:
    """``GET /nodes``: this host, the one node of a single-host service; in a fleet, every
    host (docs/fleet.md)."""
    if settings.ETCD_ENDPOINTS:
        return [_fleet_detail(node) for node in _fleet()]
    return [node_detail(node_id=local_node().label)]


def _fleet() -> list[FleetNode]:
    named = Sandbox.objects.exclude(state=Sandbox.State.KILLED).exclude(host="")
    return fleet_nodes(named.values_list("host", flat=True).distinct())


def _fleet_node(node_id: str) -> FleetNode:
    for node in _fleet():
        if node.label == node_id:
            return node
    raise NotFound(f"node '{node_id}' not found")


def _fleet_detail(node: FleetNode) -> dict[str, Any]:
    return _detail(
        node.label, Q(host=node.host_id), node.status, cpus=node.cpus, memory_mb=node.memory_mb
    )


def node_detail(*, node_id: str) -> dict[str, Any]:
    """``GET /nodes/{nodeID}`` in E2B's ``NodeDetail`` shape (a ``Node``'s fields too):
    what this host holds, from the database (one grouped query) and the runtime's
    capacity. 404 for any other id."""
    if settings.ETCD_ENDPOINTS:
        return _fleet_detail(_fleet_node(node_id))
    node = local_node()
    if node_id != node.label:
        raise NotFound(f"node '{node_id}' not found")
    capacity = node_capacity(node)
    return _detail(
        node_id,
        Q(host=node.host_id) | Q(host=""),
        "ready",
        cpus=capacity.cpus,
        memory_mb=capacity.memory_mb,
    )


def _detail(node_id: str, held: Q, status: str, *, cpus: int, memory_mb: int) -> dict[str, Any]:
    """E2B's ``NodeDetail`` of the node whose sandboxes ``held`` selects."""
    live = Sandbox.objects.filter(held)
    totals = live.filter(state=Sandbox.State.RUNNING).aggregate(
        n=Count("pk"), cpu=Sum("cpu_count"), memory=Sum("memory_mb")
    )
    starting = live.filter(state=Sandbox.State.CREATING).count()
    uname = platform.uname()
    return {
        "id": node_id,
        "serviceInstanceID": node_id,
        "clusterID": "00000000-0000-0000-0000-000000000000",
        "version": "e2bfacade",
        "commit": "",
        "status": status,
        "statusChangedAt": _started_at(),
        "sandboxCount": int(totals["n"] or 0),
        "sandboxStartingCount": starting,
        "createSuccesses": 0,
        "createFails": 0,
        "machineInfo": {
            "cpuFamily": "",
            "cpuModel": "",
            "cpuModelName": uname.processor or uname.machine,
            "cpuArchitecture": uname.machine,
        },
        "metrics": {
            "allocatedCPU": int(totals["cpu"] or 0),
            "allocatedMemoryBytes": int(totals["memory"] or 0) << 20,
            "cpuPercent": 0,
            "cpuCount": cpus,
            "memoryUsedBytes": 0,
            "memoryTotalBytes": memory_mb << 20,
            "disks": [],
            "hugePagesTotal": 0,
            "hugePagesUsed": 0,
            "hugePagesReserved": 0,
            "hugePageSizeBytes": 0,
        },
    }


def node_set_status(*, node_id: str, body: dict[str, Any]) -> None:
    """``POST /nodes/{nodeID}``: ``ready`` is what the one host is (204); another status
    is refused with a 400 naming why, never pretended."""
    node_detail(node_id=node_id)  # 404 for another id
    status = body.get("status")
    if status not in NODE_STATUSES:
        raise BadRequest(f"status must be one of {', '.join(NODE_STATUSES)}")
    if settings.ETCD_ENDPOINTS:
        if status not in membership.STATUSES:
            raise BadRequest(
                f"node status '{status}' is observed, not set: set one of "
                f"{', '.join(membership.STATUSES)}"
            )
        fleet_set_status(node_id, status)
        return
    if status != "ready":
        raise BadRequest(
            f"node status '{status}' is not supported: this service runs its sandboxes on "
            "one host, which stays ready (draining or parking it would only refuse every "
            "create; moving sandboxes to another host needs a fleet of hosts)"
        )


def _started_at() -> str:
    """When this process started: the node's status has been ``ready`` since."""
    with open(f"/proc/{os.getpid()}/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    started = datetime.now(UTC).timestamp() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    return datetime.fromtimestamp(started, UTC).isoformat().replace("+00:00", "Z")
