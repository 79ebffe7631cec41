"""What a team's builds may keep on the host: its template images (the layers its builds
captured, its templates' files and final images) within TEMPLATE_IMAGES_MAX_MB_PER_TEAM.

The executor checks the budget before each capture (a team already over it captures
nothing more) and after (a capture that takes the team over is removed again). Before it
fails a build, the team's least recently used cached layers that no template or build
names are removed: a cache is worth less than a build.

The bytes are counted from the runtime's images, not kept in the database: each image the
team's cache entries and builds name, and the layers below it down to a public template's
image or a pulled base (a whole root file system the build started on, shared and bounded
by TEMPLATE_IMAGE_MAX_MB), each image once."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings

from e2bfacade.runtime.base import Runtime, SandboxRuntimeError
from templates.builds.steps import StepFailed
from templates.models import LayerCacheEntry, Template, TemplateBuild

logger = logging.getLogger("e2bfacade.builds")


class ImageBudget:
    """One build's view of its team's image budget (see the module's docstring)."""

    def __init__(self, runtime: Runtime, team_id: int) -> None:
        self.runtime, self.team_id = runtime, team_id
        # The images this build made that no row may name yet (the finalize's files).
        self.made: set[str] = set()

    def check(self, image_id: str | None = None) -> None:
        """Raise StepFailed unless the team's images, with ``image_id`` (just made by this
        build) among them, fit the budget, after removing as many of the team's unused
        cached layers as that takes. Makes runtime calls: no transaction may be open."""
        if image_id:
            self.made.add(image_id)
        limit = settings.TEMPLATE_IMAGES_MAX_MB_PER_TEAM << 20
        while team_image_bytes(self.runtime, self.team_id, also=self.made) > limit:
            if not evict_one(self.runtime, self.team_id):
                raise StepFailed(
                    "the team's template images would take more than its limit of "
                    f"{settings.TEMPLATE_IMAGES_MAX_MB_PER_TEAM} MiB "
                    "(TEMPLATE_IMAGES_MAX_MB_PER_TEAM), with every cached layer no template "
                    "uses removed: delete templates the team no longer needs"
                )


def team_image_bytes(runtime: Runtime, team_id: int, *, also: Iterable[str] = ()) -> int:
    """The bytes of the team's template images (and of ``also``), each image once."""
    public = set(Template.objects.filter(team__isnull=True).values_list("image_id", flat=True))
    named = set(LayerCacheEntry.objects.filter(team_id=team_id).values_list("image_id", flat=True))
    named |= set(
        TemplateBuild.objects.filter(team_id=team_id)
        .exclude(image_id="")
        .values_list("image_id", flat=True)
    )
    named |= set(also)
    seen: set[str] = set()
    total = 0
    for image_id in named:
        current: str | None = image_id
        while current and current not in seen and current not in public:
            seen.add(current)
            try:
                info = runtime.image_info(current)
            except SandboxRuntimeError:
                break  # swept meanwhile: it holds no bytes
            if info.parent is None and current not in named:
                break  # a whole root file system under the team's layers: a pulled base
            total += info.size_bytes
            current = info.parent
    return total


def evict_one(runtime: Runtime, team_id: int) -> bool:
    """Remove the team's least recently used cached layer that no template or build (of
    any team) names, and its image unless another cache entry names it or it is in use (a
    layer under another image, or a running sandbox's: the image sweep removes it once
    free). Returns whether there was one to remove."""
    entry = (
        LayerCacheEntry.objects.filter(team_id=team_id)
        .exclude(image_id__in=Template.objects.values("image_id"))
        .exclude(image_id__in=TemplateBuild.objects.exclude(image_id="").values("image_id"))
        .order_by("last_used_at", "pk")
        .first()
    )
    if entry is None:
        return False
    LayerCacheEntry.objects.filter(pk=entry.pk).delete()
    logger.info("team %s over its image budget: evicted cached layer %s", team_id, entry.image_id)
    if not LayerCacheEntry.objects.filter(image_id=entry.image_id).exists():
        try:
            runtime.delete_image(entry.image_id)
        except SandboxRuntimeError as exc:
            logger.info("image %s kept for now: %s", entry.image_id, exc.message)
    return True
