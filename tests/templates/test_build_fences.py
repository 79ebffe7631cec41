"""A build worker that lost its lease changes nothing of the build: it ends no build that
another worker now holds, and leaves that worker's build sandbox (same id: the build's)
alone; a build that was canceled is still ended, and its sandbox killed, at once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from templates.builds.services import finish_error
from templates.builds.worker import Lease
from templates.models import BuildStatus, TemplateBuild
from tests.support.factories import TeamFactory, TemplateFactory
from tests.support.waiting import eventually

pytestmark = pytest.mark.django_db(transaction=True)


def held_build(owner: str) -> TemplateBuild:
    team = TeamFactory.create()
    template = TemplateFactory.create(team=team, image_id="")
    return TemplateBuild.objects.create(
        template=template,
        team=team,
        status=BuildStatus.BUILDING,
        lease_owner=owner,
        lease_until=timezone.now() + timedelta(seconds=30),
        attempts=2,
    )


def test_a_worker_cannot_end_a_build_another_worker_took_over() -> None:
    build = held_build("successor")
    assert finish_error(build, "step failed", step="2", owner="stalled") is False
    build.refresh_from_db()
    assert (build.status, build.lease_owner, build.reason) == ("building", "successor", None)
    assert finish_error(build, "step failed", step="2", owner="successor") is True
    build.refresh_from_db()
    assert (build.status, build.reason) == ("error", {"message": "step failed", "step": "2"})


def lease_lost_kills(build: TemplateBuild, settings: object) -> int:
    """How many times the keeper of a lease held by ``stalled`` kills the build sandbox
    once its renewal finds the lease gone."""
    settings.TEMPLATE_BUILD_LEASE_SECONDS = 1  # type: ignore[attr-defined]
    lease = Lease(build, "stalled")
    kills: list[int] = []
    keeper = lease.keep(lambda: kills.append(1), lambda: None)
    keeper.join(timeout=10)
    assert not keeper.is_alive() and lease.lost.is_set()
    return len(kills)


def test_a_lost_lease_leaves_the_successors_build_sandbox_alone(settings: object) -> None:
    build = held_build("successor")
    assert lease_lost_kills(build, settings) == 0


def test_a_canceled_build_has_its_sandbox_killed_by_its_worker(settings: object) -> None:
    build = held_build("stalled")
    TemplateBuild.objects.filter(pk=build.pk).update(status=BuildStatus.ERROR, lease_owner="")
    assert lease_lost_kills(build, settings) == 1


def test_the_lease_keeper_outlives_a_database_error(
    settings: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    build = held_build("stalled")
    settings.TEMPLATE_BUILD_LEASE_SECONDS = 1  # type: ignore[attr-defined]
    lease = Lease(build, "stalled")
    real_renew, calls = lease.renew, []

    def renew() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return real_renew()

    monkeypatch.setattr(lease, "renew", renew)
    keeper = lease.keep(lambda: None, lambda: None)
    try:
        eventually(lambda: len(calls), until=lambda n: n >= 3, within=10, what="a third renewal")
        alive = keeper.is_alive()
    finally:
        lease.done.set()
        keeper.join(timeout=5)
    assert len(calls) >= 3 and alive, calls
    build.refresh_from_db()
    assert build.lease_owner == "stalled" and not lease.lost.is_set()
