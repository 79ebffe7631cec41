"""Template builds are bounded per team: one team's queue never delays another team's build
beyond that team's own queue (the claim's fair share), a team runs at most
TEMPLATE_BUILDS_RUNNING_PER_TEAM builds at once, a build ends ``error`` past
TEMPLATE_BUILD_TIMEOUT_SECONDS, a team's images stay within TEMPLATE_IMAGES_MAX_MB_PER_TEAM, a
build captures its writable layer a bounded number of times, and only the host that received
a build's trigger (and holds its archives) claims it.

The claim is tested in the database (real PostgreSQL, the worker's own ``claim``); the
bounds a running build meets through the real executor on the local runtime."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from e2bfacade import sandbox_runtime
from e2bfacade.models import Team
from e2bfacade.runtime.local import LocalRuntime
from templates.builds.executor import MAX_LAYERS_PER_BUILD
from templates.builds.worker import claim, run
from templates.models import BuildStatus, LayerCacheEntry, Template, TemplateBuild
from tests.contract.template_support import run_step
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.support.factories import TeamFactory, TemplateFactory

HOST = "host-a:/var/lib/e2bfacade-a"
OTHER_HOST = "host-b:/var/lib/e2bfacade-b"


# ---------------------------------------------------------------------------- the claim
def queued(
    template: Template, at: datetime, *, host: str = HOST, steps: tuple[dict[str, Any], ...] = ()
) -> TemplateBuild:
    """A triggered build nobody holds yet."""
    assert template.team is not None
    return TemplateBuild.objects.create(
        template=template,
        team=template.team,
        status=BuildStatus.BUILDING,
        cpu_count=1,
        memory_mb=512,
        spec={"fromTemplate": "base", "force": False, "steps": list(steps)},
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

    body = services.build_request_body({"name": "on-this-host"})
    requested = services.build_request(team=team, body=body)
    services.build_trigger(
        team=team,
        template_ref=requested.template.template_id,
        build_id=str(requested.build.build_id),
        body={"fromTemplate": "base", "steps": []},
    )
    requested.build.refresh_from_db()
    assert requested.build.host == get_runtime().host_id != ""


# ------------------------------------------------------------------- a running build
@pytest.fixture
def host(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalRuntime]:
    """This process as a build host: a local runtime on a scratch root is the process's
    runtime, and the public ``base`` template (a data migration's row, gone from a flushed
    test database) is there to build on."""
    rt = make_runtime("e2bb-")
    settings.SANDBOX_ROOT = rt.root
    monkeypatch.setitem(sandbox_runtime._runtimes, f"{settings.SANDBOX_RUNTIME}:{rt.root}", rt)
    Template.objects.get_or_create(
        template_id="base", defaults={"alias": "base", "image_id": "base", "team": None}
    )
    try:
        yield rt
    finally:
        destroy_runtime(rt)


def build_now(rt: LocalRuntime, template: Template, *steps: dict[str, Any]) -> TemplateBuild:
    """Trigger a build of ``steps`` on ``base`` and run it here, as a build worker would."""
    build = queued(template, timezone.now(), host=rt.host_id, steps=steps)
    claimed = claim("builder-0", host=rt.host_id)
    assert claimed is not None and claimed.pk == build.pk
    run(claimed, "builder-0")
    build.refresh_from_db()
    return build


def made_by(rt: LocalRuntime, build: TemplateBuild) -> dict[str, int]:
    """The images the runtime holds that are not the ``base`` it started on, by size."""
    return {i: rt.image_info(i).size_bytes for i in rt.list_images() if i != "base"}


@pytest.mark.django_db(transaction=True)
def test_a_build_past_its_time_limit_ends_error(host: LocalRuntime, settings: Any) -> None:
    settings.TEMPLATE_BUILD_TIMEOUT_SECONDS = 5
    _, template = team_with_template()
    began = time.monotonic()
    build = build_now(host, template, run_step("echo started; sleep 120"))
    took = time.monotonic() - began
    assert build.status == BuildStatus.ERROR, (build.status, build.reason, took)
    assert build.reason is not None
    message = build.reason["message"]
    assert "5 s (TEMPLATE_BUILD_TIMEOUT_SECONDS)" in message, message
    assert build.reason.get("step") == "1"
    # Ended at its limit, not at the step's end; its sandbox is gone.
    assert took < 60, took
    assert build.sandbox_id not in host.live_ids()


@pytest.mark.django_db(transaction=True)
def test_a_build_captures_what_it_wrote_a_bounded_number_of_times(host: LocalRuntime) -> None:
    """200 MB written once, then slow steps that write nothing: every slow step used to
    capture the whole writable layer again (1.2 GB of images for 200 MB of files)."""
    team, template = team_with_template()
    write = run_step("head -c 200000000 /dev/zero | tr '\\0' x > /blob && sleep 2.5")
    slow = [run_step(f"sleep 2.5 # {n}") for n in range(4)]
    build = build_now(host, template, write, *slow)
    assert build.status == BuildStatus.READY, build.reason
    images = made_by(host, build)
    captured = sum(images.values())
    # The step that wrote the blob, and the template's files (finalize): twice, no more.
    assert captured < 2.2 * 200_000_000, images
    assert captured >= 2 * 200_000_000, images
    # The cache still starts a rebuild after the step that wrote.
    assert LayerCacheEntry.objects.filter(team=team).count() >= 2


@pytest.mark.django_db(transaction=True)
def test_a_build_of_many_slow_steps_keeps_a_bounded_number_of_layers(host: LocalRuntime) -> None:
    _, template = team_with_template()
    steps = [
        run_step(f"echo {n} > /step-{n} && sleep 2.2") for n in range(MAX_LAYERS_PER_BUILD + 2)
    ]
    build = build_now(host, template, *steps)
    assert build.status == BuildStatus.READY, build.reason
    # Each layer is a cache entry; one more is the finalize's.
    layers = LayerCacheEntry.objects.filter(team_id=build.team_id).count() - 1
    assert layers == MAX_LAYERS_PER_BUILD, made_by(host, build)


@pytest.mark.django_db(transaction=True)
def test_a_team_over_its_image_budget_gets_a_clear_error_and_no_more_bytes(
    host: LocalRuntime, settings: Any
) -> None:
    settings.TEMPLATE_IMAGES_MAX_MB_PER_TEAM = 64
    _, template = team_with_template()
    big = run_step("head -c 100000000 /dev/zero | tr '\\0' x > /blob && sleep 2.5")
    build = build_now(host, template, big, run_step("true"))
    assert build.status == BuildStatus.ERROR, build.status
    assert build.reason is not None
    message = build.reason["message"]
    assert "64 MiB (TEMPLATE_IMAGES_MAX_MB_PER_TEAM)" in message, message
    assert build.reason.get("step") == "1"
    # What it captured past the budget was not kept.
    assert sum(made_by(host, build).values()) <= 64 << 20, made_by(host, build)


@pytest.mark.django_db(transaction=True)
def test_a_team_at_its_image_budget_loses_its_oldest_unused_cache_layers_first(
    host: LocalRuntime, settings: Any
) -> None:
    settings.TEMPLATE_IMAGES_MAX_MB_PER_TEAM = 100
    team, first = team_with_template()
    second = TemplateFactory.create(team=team, image_id="")
    # 40 MB captured twice (its slow step, its finalize): 80 MB of the team's 100.
    forty = run_step("head -c 40000000 /dev/zero | tr '\\0' x > /a && sleep 2.5")
    one = build_now(host, first, forty)
    assert one.status == BuildStatus.READY, one.reason
    # The template points at its image: that layer is in use, the step's layer is not.
    Template.objects.filter(pk=first.pk).update(image_id=one.image_id)
    cached_step = LayerCacheEntry.objects.exclude(image_id=one.image_id).get()
    # 2 x 20 MB more: over the budget unless the first build's step layer goes.
    twenty = run_step("head -c 20000000 /dev/zero | tr '\\0' y > /b && sleep 2.5")
    two = build_now(host, second, twenty)
    assert two.status == BuildStatus.READY, two.reason
    assert not LayerCacheEntry.objects.filter(pk=cached_step.pk).exists()
    assert cached_step.image_id not in host.list_images()
    # The first template's image is kept.
    assert one.image_id in host.list_images()
