"""The build state machine's request step, in the database: a build requested and never
triggered ends on the team's next request after an hour, instead of counting against the
team's limit of builds in progress for ever."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from e2bfacade.models import Team
from templates.builds import services
from templates.models import BuildStatus, TemplateBuild


def test_a_build_never_triggered_ends_and_frees_the_teams_limit(team: Team, settings: Any) -> None:
    settings.TEMPLATE_BUILDS_PER_TEAM = 2
    stale = [services.build_request(team=team, body={"name": f"t{n}"}).build for n in range(2)]
    TemplateBuild.objects.filter(pk__in=[b.pk for b in stale]).update(
        created_at=timezone.now() - timedelta(seconds=services.WAITING_SECONDS + 1)
    )
    # At the limit, but both are stale: a third request is admitted, and they end.
    fresh = services.build_request(team=team, body={"name": "t2"}).build
    assert fresh.status == BuildStatus.WAITING
    for build in stale:
        build.refresh_from_db()
        assert build.status == BuildStatus.ERROR
        assert build.reason == {"message": services.NEVER_STARTED}
    # One fresh waiting build and one more still fit; a third is E2B's 429.
    services.build_request(team=team, body={"name": "t3"})
    try:
        services.build_request(team=team, body={"name": "t4"})
    except services.TooManyBuilds as exc:
        assert "maximum number of concurrent template builds (2)" in exc.message
    else:
        raise AssertionError("a third build in progress was admitted")
