"""What every app's views read from a DRF request: the caller's team and the JSON body.

Here, in the ground app, because every app's views need them and no app may import another
app's views (sandboxes, snapshots and templates each serve their own routes).
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request

from e2bfacade.auth import TeamPrincipal
from e2bfacade.errors import BadRequest
from e2bfacade.models import Team


def team_of(request: Request) -> Team:
    """The authenticated caller's team (the view's permission class guarantees one)."""
    user = request.user
    assert isinstance(user, TeamPrincipal)  # guaranteed by IsAuthenticated
    return user.team


def json_body(request: Request) -> dict[str, Any]:
    """The JSON body; an absent body counts as ``{}`` (several E2B bodies are optional),
    anything but an object is a 400."""
    data = request.data
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data
