"""Template builds are bounded per team: one team's queue never delays another team's build
beyond that team's own queue (the claim's fair share), a team runs at most
TEMPLATE_BUILDS_RUNNING_PER_TEAM builds at once, a build ends ``error`` past
TEMPLATE_BUILD_TIMEOUT_SECONDS, a team's images stay within TEMPLATE_IMAGE_MB_PER_TEAM, a
build captures its writable layer a bounded number of times, and only the host that received
a build's trigger (and holds its archives) claims it.

The claim is tested in the database (real PostgreSQL, the worker's own ``claim``); the
bounds a running build meets through the real executor on the local runtime."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from e2bfacade.models import Team
from templates.builds.worker import claim
from templates.models import BuildStatus, Template, TemplateBuild
from tests.support.factories import TeamFactory, TemplateFactory

HOST = "host-a:/var/lib/e2bfacade-a"
OTHER_HOST = "host-b:/var/lib/e2bfacade-b"


# ---------------------------------------------------------------------------- the claim
def queued(template: Template, at: datetime, *, host: str = HOST) -> TemplateBuild:
    """A triggered build nobody holds yet."""
    assert template.team is not None
    return TemplateBuild.objects.create(
        template=template,
        team=template.team,
        status=BuildStatus.BUILDING,
        spec={"fromTemplate": "base", "force": False, "steps": []},
        started_at=at,
        host=host,
    )


def finish(build: TemplateBuild) -> None:
    TemplateBuild.objects.filter(pk=build.pk).update(
        status=BuildStatus.READY, lease_owner="", lease_until=None, finished_at=timezone.now()
    )


def team_with_template() -> tuple[Team, Template]:
    team = TeamFactory.create()
    return team, TemplateFactory.create(team=team, image_id="")


@pytest.mark.django_db(transaction=True)
def test_another_teams_build_starts_after_at_most_one_of_a_busy_teams_builds() -> None:
    _, busy = team_with_template()
    _, other = team_with_template()
    now = timezone.now()
    # The busy team queued its builds first: with one build worker, first come first
    # served would run all of them before the other team's one build.
    mine = [queued(busy, now - timedelta(seconds=60 - n)) for n in range(4)]
    theirs = queued(other, now)
    order = []
    while (build := claim("builder-0", host=HOST)) is not None:
        order.append(build.pk)
        finish(build)
    assert sorted(order) == sorted([b.pk for b in [*mine, theirs]])
    assert order.index(theirs.pk) <= 1, ["other" if pk == theirs.pk else "busy" for pk in order]
    # Within one team, its own builds keep their order.
    assert [pk for pk in order if pk != theirs.pk] == [b.pk for b in mine]


@pytest.mark.django_db(transaction=True)
def test_a_team_runs_no_more_builds_at_once_than_its_limit(settings: Any) -> None:
    settings.TEMPLATE_BUILDS_RUNNING_PER_TEAM = 1
    team, busy = team_with_template()
    _, other = team_with_template()
    now = timezone.now()
    for n in range(3):
        queued(busy, now - timedelta(seconds=60 - n))
    theirs = queued(other, now)
    first = claim("builder-0", host=HOST)
    second = claim("builder-1", host=HOST)
    third = claim("builder-2", host=HOST)
    assert first is not None and first.team_id == team.pk
    assert second is not None and second.pk == theirs.pk
    # The busy team has one running: its next build waits for it, though a worker is free.
    assert third is None
    finish(first)
    fourth = claim("builder-2", host=HOST)
    assert fourth is not None and fourth.team_id == team.pk


@pytest.mark.django_db(transaction=True)
def test_a_build_triggered_on_one_host_is_claimed_by_that_hosts_workers_only() -> None:
    _, template = team_with_template()
    build = queued(template, timezone.now(), host=HOST)
    assert claim("builder-0", host=OTHER_HOST) is None
    claimed = claim("builder-0", host=HOST)
    assert claimed is not None and claimed.pk == build.pk
    assert claimed.running_since is not None


@pytest.mark.django_db(transaction=True)
def test_a_trigger_records_the_host_that_received_it(team: Team) -> None:
    from e2bfacade.sandbox_runtime import get_runtime
    from templates.builds import services

    requested = services.build_request(team=team, body={"name": "on-this-host"})
    services.build_trigger(
        team=team,
        template_ref=requested.template.template_id,
        build_id=str(requested.build.build_id),
        body={"fromTemplate": "base", "steps": []},
    )
    requested.build.refresh_from_db()
    assert requested.build.host == get_runtime().host_id != ""
