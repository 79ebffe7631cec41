"""The sandbox routes that honour Idempotency-Key, as re-drivable operations (the snapshot
and fork routes register theirs in ``snapshots/idempotent.py``).

Each ``execute`` converges on one resource per reserved id, whoever calls it: the original
request, a retry that took over after a crash, or the worker.
"""

from __future__ import annotations

from typing import Any

from e2bfacade.models import Team
from e2bfacade.runtime.base import SandboxRuntimeError
from idempotency.registry import Operation, register
from nodes.selectors import is_local, local_runtime
from sandboxes import services
from sandboxes.models import Sandbox, new_sandbox_id
from sandboxes.serializers import SandboxSerializer, create_request_from
from sandboxes.volumes import idempotent as volume_idempotent  # noqa: F401  (POST /volumes)

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


def _here(params: dict[str, str], rid: str) -> bool:
    """Whether this host holds the sandbox being created (or none holds it yet)."""
    host = Sandbox.objects.filter(pk=rid).values_list("host", flat=True).first()
    return is_local(host)


def _undo(rid: str) -> bool:
    """End whatever the runtime made for ``rid`` (no database needed)."""
    try:
        local_runtime().kill(rid)
    except SandboxRuntimeError:
        return False
    return True


for route in (CREATE_V2, CREATE_V1):
    register(
        Operation(
            route,
            new_sandbox_id,
            _create,
            reserve=_reserve_sandbox,
            resource_model="sandboxes.Sandbox",
            here=_here,
            undo=_undo,
        )
    )
