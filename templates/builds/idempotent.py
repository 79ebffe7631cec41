"""``POST /v3/templates`` honours Idempotency-Key, as a re-drivable operation (imported by
the app's ready()).

The reserved id is the build's UUID: the original request, a retry that took over after a
crash, or the worker all converge on that one build (the request is idempotent by build id,
and one transaction makes the template and the build). The v2 trigger needs no key: a
repeat of the same body answers 202 again and another body 400, as on E2B."""

from __future__ import annotations

import uuid
from typing import Any

from e2bfacade.models import Team
from idempotency.registry import Operation, register
from templates.builds import services

REQUEST_BUILD = "POST /v3/templates"


def _new_build_id() -> str:
    return str(uuid.uuid4())


def _request(
    team: Team, params: dict[str, str], body: dict[str, Any], rid: str, reserved: Any
) -> tuple[int, Any]:
    done = services.build_request(team=team, body=body, build_id=uuid.UUID(rid))
    alias = done.template.alias or ""
    return 202, {
        "templateID": done.template.template_id,
        "buildID": str(done.build.build_id),
        "public": False,
        "names": [alias],
        "aliases": [alias],
        "tags": done.tags,
    }


register(
    Operation(
        REQUEST_BUILD,
        _new_build_id,
        _request,
        resource_model="templates.TemplateBuild",
    )
)
