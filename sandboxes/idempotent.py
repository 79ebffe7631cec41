"""The sandbox routes that honour Idempotency-Key, as re-drivable operations.

Each ``execute`` converges on one resource per reserved id, whoever calls it: the original
request, a retry that took over after a crash, or the worker.
"""

from __future__ import annotations

from typing import Any, cast

from e2bfacade.models import Team
from idempotency.registry import Operation, register
from sandboxes import services
from sandboxes.models import Sandbox, new_sandbox_id
from sandboxes.serializers import SandboxSerializer, create_request_from
from snapshots import services as snapshot_services
from snapshots.serializers import SnapshotInfoSerializer
from templates.models import new_template_id

CREATE_V2 = "POST /v2/sandboxes"
CREATE_V1 = "POST /sandboxes"
SNAPSHOT = "POST /sandboxes/{sandboxID}/snapshots"
FORK = "POST /sandboxes/{sandboxID}/fork"


def _reserve_sandbox(team: Team, params: dict[str, str], body: dict[str, Any], rid: str) -> None:
    services.sandbox_reserve(team=team, request=create_request_from(body), sandbox_id=rid)


def _create(team: Team, params: dict[str, str], body: dict[str, Any], rid: str) -> tuple[int, Any]:
    sandbox = services.sandbox_create(team=team, request=create_request_from(body), sandbox_id=rid)
    return 201, SandboxSerializer(sandbox).data


def _snapshot(
    team: Team, params: dict[str, str], body: dict[str, Any], rid: str
) -> tuple[int, Any]:
    snapshot = snapshot_services.snapshot_create(
        team=team, sandbox_id=params["sandbox_id"], name=body.get("name"), snapshot_id=rid
    )
    return 201, SnapshotInfoSerializer(snapshot).data


def _fork(team: Team, params: dict[str, str], body: dict[str, Any], rid: str) -> tuple[int, Any]:
    results = snapshot_services.sandbox_fork(
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


for route in (CREATE_V2, CREATE_V1):
    register(Operation(route, new_sandbox_id, _create, reserve=_reserve_sandbox))
register(Operation(SNAPSHOT, new_template_id, _snapshot))
register(Operation(FORK, new_template_id, _fork))
