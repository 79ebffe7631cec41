"""The snapshot and fork routes that honour Idempotency-Key, as re-drivable operations
(registered by ``SnapshotsConfig.ready()``; the sandbox create routes are in
``sandboxes/idempotent.py``).

Each ``execute`` converges on one resource per reserved id, whoever calls it: the original
request, a retry that took over after a crash, or the worker.
"""

from __future__ import annotations

from typing import Any, cast

from e2bfacade.models import Team
from idempotency.registry import Operation, register
from nodes.selectors import is_local
from sandboxes.models import Sandbox
from sandboxes.serializers import SandboxSerializer
from snapshots import services
from snapshots.serializers import SnapshotInfoSerializer
from templates.models import new_template_id

SNAPSHOT = "POST /sandboxes/{sandboxID}/snapshots"
FORK = "POST /sandboxes/{sandboxID}/fork"


def _snapshot(
    team: Team, params: dict[str, str], body: dict[str, Any], rid: str, reserved: None
) -> tuple[int, Any]:
    snapshot = services.snapshot_create(
        team=team,
        sandbox_id=params["sandbox_id"],
        name=body.get("name"),
        snapshot_id=rid,
        memory=body.get("memory"),
    )
    return 201, SnapshotInfoSerializer(snapshot).data


def _fork(
    team: Team, params: dict[str, str], body: dict[str, Any], rid: str, reserved: None
) -> tuple[int, Any]:
    results = services.sandbox_fork(
        team=team,
        sandbox_id=params["sandbox_id"],
        timeout=body["timeout"],
        count=body["count"],
        fork_id=rid,
    )
    return 201, [
        {"sandbox": SandboxSerializer(cast(Sandbox, r["sandbox"])).data} if "sandbox" in r else r
        for r in results
    ]


def _source_here(params: dict[str, str], rid: str) -> bool:
    """Whether this host holds the sandbox snapshotted or forked (its image is made here)."""
    host = Sandbox.objects.filter(pk=params["sandbox_id"]).values_list("host", flat=True).first()
    return is_local(host)


register(
    Operation(
        SNAPSHOT,
        new_template_id,
        _snapshot,
        resource_model="snapshots.Snapshot",
        here=_source_here,
    )
)
# The admin links no resource for a fork (as before the registry named resources): its id
# names the set's hidden fork image, and the sandboxes it made have derived ids.
register(Operation(FORK, new_template_id, _fork, here=_source_here))
