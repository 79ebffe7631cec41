"""What the operator does to sandboxes across a team or the host (E2B's admin routes, and
the admin site's actions): kill a team's sandboxes, count the running ones per team."""

from __future__ import annotations

import logging

from django.db.models import Count

from e2bfacade.errors import ApiError, NotFound
from e2bfacade.models import Team
from sandboxes.models import Sandbox
from sandboxes.services import sandbox_kill

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
