"""``POST /volumes`` honours Idempotency-Key, as a re-drivable operation (imported by
``sandboxes/idempotent.py``, which the app's ready() imports).

The reserved id is the volume's UUID: the original request, a retry that took over after a
crash, or the worker all converge on that one volume (the runtime's create is idempotent by
id)."""

from __future__ import annotations

import uuid
from typing import Any

from e2bfacade.errors import ApiError
from e2bfacade.models import Team
from idempotency.registry import Operation, register
from nodes.selectors import is_local
from sandboxes.models import Volume
from sandboxes.volumes import services
from sandboxes.volumes.serializers import volume_and_token

CREATE_VOLUME = "POST /volumes"


def _new_volume_id() -> str:
    return str(uuid.uuid4())


def _reserve(team: Team, params: dict[str, str], body: dict[str, Any], rid: str) -> Volume:
    return services.volume_reserve(team=team, name=body["name"], volume_id=rid)


def _create(
    team: Team, params: dict[str, str], body: dict[str, Any], rid: str, reserved: Volume | None
) -> tuple[int, Any]:
    volume = services.volume_create(team=team, name=body["name"], volume_id=rid, reserved=reserved)
    return 201, volume_and_token(volume)


def _here(params: dict[str, str], rid: str) -> bool:
    """Whether this host holds the volume being created (or none holds it yet)."""
    host = Volume.objects.filter(pk=rid).values_list("host", flat=True).first()
    return is_local(host)


def _undo(rid: str) -> bool:
    """Remove whatever storage an unfinished create made for ``rid`` (no database needed;
    the row it may have left ``creating`` is the sweep's)."""
    try:
        services.volume_runtime().delete_volume(rid)
    except (*services.STORAGE_ERRORS, ApiError):
        return False
    return True


register(
    Operation(
        CREATE_VOLUME,
        _new_volume_id,
        _create,
        reserve=_reserve,
        resource_model="sandboxes.Volume",
        here=_here,
        undo=_undo,
    )
)
