"""Tags follow E2B's order: a tag resolves to the newest *requested* build that is ready, so
a build that was requested first but finished last does not take a tag from the build
requested after it (E2B assigns tags when a build is requested)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from templates.builds import tags
from templates.builds.steps import Context
from templates.builds.worker import _finish_ready
from templates.models import BuildStatus, TemplateBuild, TemplateTag
from tests.support.factories import TeamFactory, TemplateFactory

pytestmark = pytest.mark.django_db


def test_a_build_requested_first_and_ready_last_does_not_take_the_later_ones_tags() -> None:
    team = TeamFactory.create()
    template = TemplateFactory.create(team=team, image_id="")
    now = timezone.now()

    def building(name: str, requested_ago: int) -> TemplateBuild:
        build = TemplateBuild.objects.create(
            template=template,
            team=team,
            status=BuildStatus.BUILDING,
            lease_owner="w",
            lease_until=now + timedelta(seconds=60),
            tags=["default", "v1", name],
        )
        TemplateBuild.objects.filter(pk=build.pk).update(
            created_at=now - timedelta(seconds=requested_ago)
        )
        build.refresh_from_db()
        return build

    first, second = building("first", 20), building("second", 10)
    _finish_ready(second, "w", "img-second", Context(), time.monotonic())
    _finish_ready(first, "w", "img-first", Context(), time.monotonic())
    held = dict(TemplateTag.objects.filter(template=template).values_list("tag", "build_id"))
    assert held == {
        "default": second.pk,
        "v1": second.pk,
        "second": second.pk,
        "first": first.pk,  # its own tag, which no later build holds
    }
    template.refresh_from_db()
    assert template.image_id == "img-second"
    resolved = tags.resolve(team.pk, f"{template.alias}:v1")
    assert resolved is not None and resolved.image_id == "img-second"
    # The operator's or user's explicit assignment still moves a tag anywhere.
    tags.point(template, first, ["v1"])
    assert TemplateTag.objects.get(template=template, tag="v1").build_id == first.pk
