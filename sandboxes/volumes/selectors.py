"""Volume reads that are more than a lookup."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from sandboxes.models import SandboxVolumeMount, Volume


def volume_list(*, team_id: int) -> QuerySet[Volume]:
    """The team's ready volumes, oldest first (one being created or deleted is not listed)."""
    return Volume.objects.filter(team_id=team_id, state=Volume.State.READY).order_by(
        "created_at", "pk"
    )


def sandbox_volume_mounts(*, sandbox_id: str) -> list[dict[str, Any]]:
    """``volumeMounts`` of ``GET /sandboxes/{id}``: the volumes its create named, in order."""
    rows = (
        SandboxVolumeMount.objects.filter(sandbox_id=sandbox_id)
        .order_by("pk")
        .values_list("volume__name", "path")
    )
    return [{"name": name, "path": path} for name, path in rows]
