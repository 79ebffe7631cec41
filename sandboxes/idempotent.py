"""The sandbox routes that honour Idempotency-Key, as re-drivable operations (the snapshot
and fork routes register theirs in ``snapshots/idempotent.py``).

Each ``execute`` converges on one resource per reserved id, whoever calls it: the original
request, a retry that took over after a crash, or the worker.
"""

from __future__ import annotations

from typing import Any

from e2bfacade.models import Team
from idempotency.registry import Operation, register
from sandboxes import services
from sandboxes.models import Sandbox, new_sandbox_id
from sandboxes.serializers import SandboxSerializer, create_request_from

CREATE_V2 = "POST /v2/sandboxes"
CREATE_V1 = "POST /sandboxes"


def _reserve_sandbox(team: Team, params: dict[str, str], body: dict[str, Any], rid: str) -> Sandbox:
    return services.sandbox_reserve(team=team, request=create_request_from(body), sandbox_id=rid)


def _create(
    team: Team, params: dict[str, str], body: dict[str, Any], rid: str, reserved: Sandbox | None
) -> tuple[int, Any]:
    sandbox = services.sandbox_create(
        team=team, request=create_request_from(body), sandbox_id=rid, reserved=reserved
    )
    return 201, SandboxSerializer(sandbox).data


for route in (CREATE_V2, CREATE_V1):
    register(
        Operation(
            route,
            new_sandbox_id,
            _create,
            reserve=_reserve_sandbox,
            resource_model="sandboxes.Sandbox",
        )
    )
