"""Tags: movable pointers from (template, tag) to a ready build. ``default`` is what a plain
name starts; moving it moves the template's image. ``name:tag`` resolves through them
wherever a template is named (sandbox create, ``fromTemplate``, the tag routes)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import transaction

from e2bfacade.errors import BadRequest, NotFound
from e2bfacade.models import Team
from templates.builds import names
from templates.builds.services import Forbidden
from templates.models import (
    DEFAULT_TAG,
    BuildStatus,
    TagAssignment,
    Template,
    TemplateBuild,
    TemplateTag,
)


@dataclass(frozen=True)
class Resolved:
    template: Template
    image_id: str
    build: TemplateBuild | None  # None: a template that was never built here


def point(
    template: Template, build: TemplateBuild, tags: list[str], *, by_request: bool = False
) -> list[str]:
    """Point ``tags`` of ``template`` at ``build`` (in the caller's transaction); ``default``
    also makes the build's image and shape the template's. Returns the tags it moved.

    ``by_request`` (a build becoming ready): as E2B, whose tags are assigned when a build is
    requested and resolve to the newest *requested* ready build, a tag already held by a
    ready build requested after this one stays where it is."""
    moved = []
    for tag in tags:
        if by_request and (
            TemplateTag.objects.filter(template=template, tag=tag)
            .exclude(build=build)
            .filter(build__created_at__gt=build.created_at)
            .exists()
        ):
            continue
        TemplateTag.objects.update_or_create(template=template, tag=tag, defaults={"build": build})
        TagAssignment.objects.create(template=template, tag=tag, build=build)
        moved.append(tag)
    if DEFAULT_TAG in moved:
        Template.objects.filter(pk=template.pk).update(
            image_id=build.image_id, cpu_count=build.cpu_count, memory_mb=build.memory_mb
        )
    return moved


def resolve(team_id: int, ref: str, *, locked: bool = False) -> Resolved | None:
    """The template and image ``ref`` names for this team: an id or name as before, or
    ``name:tag``. None when nothing matches."""
    finder = Template.objects.resolve_locked if locked else Template.objects.resolve
    template = finder(team_id, ref)
    if template is not None:
        return Resolved(template, template.image_id, None)
    if ":" not in ref:
        return None
    try:
        name = names.parse(ref)
    except BadRequest:
        return None
    template = finder(team_id, name.name)
    if template is None:
        return None
    tag = (
        TemplateTag.objects.select_related("build")
        .filter(template=template, tag=name.tag_or_default)
        .first()
    )
    if tag is None:
        return None
    return Resolved(template, tag.build.image_id, tag.build)


def _owned(team: Team, ref: str) -> Template:
    template = Template.objects.resolve(team.pk, ref)
    if template is None or template.kind != Template.Kind.TEMPLATE:
        if Template.objects.filter(alias=ref).exists():
            raise Forbidden(f"template '{ref}' belongs to another team")
        raise NotFound(f"template '{ref}' not found")
    if template.team_id != team.pk:
        raise Forbidden(f"template '{ref}' is not yours to tag")
    return template


def assign(*, team: Team, target: object, tags: object) -> tuple[TemplateBuild, list[str]]:
    """``POST /templates/tags``: the build ``target`` (``name[:tag]``) points at gets
    ``tags`` too."""
    if not isinstance(tags, list) or not tags:
        raise BadRequest("At least one tag is required")
    wanted = names.tags(tags)
    name = names.parse(target, what="target")
    with transaction.atomic():
        template = _owned(team, name.name)
        Template.objects.select_for_update().filter(pk=template.pk).first()
        tag = TemplateTag.objects.filter(template=template, tag=name.tag_or_default).first()
        if tag is None:
            raise NotFound(f"Template '{name.name}' with tag '{name.tag_or_default}' not found")
        build = TemplateBuild.objects.get(pk=tag.build_id)
        point(template, build, wanted)
    return build, wanted


def remove(*, team: Team, name: object, tags: object) -> None:
    """``DELETE /templates/tags``: the tags stop pointing anywhere (``default`` stays)."""
    parsed = names.parse(name)
    if parsed.tag is not None or (isinstance(name, str) and ":" in name):
        raise BadRequest("name must not carry a tag")
    if not isinstance(tags, list) or not tags:
        raise BadRequest("At least one tag is required")
    wanted = names.tags(tags)
    if DEFAULT_TAG in wanted:
        raise BadRequest("the 'default' tag cannot be removed")
    with transaction.atomic():
        template = _owned(team, parsed.name)
        TemplateTag.objects.filter(template=template, tag__in=wanted).delete()


def listed(*, team: Team, ref: str) -> list[dict[str, object]]:
    template = _visible(team, ref)
    return [
        {"tag": t.tag, "buildID": str(t.build_id), "createdAt": t.created_at}
        for t in TemplateTag.objects.filter(template=template).order_by("created_at", "tag")
    ]


def _visible(team: Team, ref: str) -> Template:
    template = Template.objects.resolve(team.pk, ref)
    if template is None or template.kind == Template.Kind.FORK:
        raise NotFound(f"template '{ref}' not found")
    return template


def count(*, team: Team, ref: str) -> dict[str, int]:
    template = _visible(team, ref)
    return {"total": TemplateTag.objects.filter(template=template).count()}


def exists(*, team: Team, ref: str, tag: object) -> dict[str, object]:
    template = _visible(team, ref)
    normalized = names.check_tag(tag if isinstance(tag, str) else "")
    found = TemplateTag.objects.filter(template=template, tag=normalized).exists()
    return {"exists": found, "normalizedTag": normalized}


def _assignment(a: TagAssignment) -> dict[str, object]:
    return {
        "assignmentId": str(uuid.UUID(int=a.pk)),
        "buildId": str(a.build_id),
        "assignedAt": a.created_at,
        "buildCreatedAt": a.build.created_at,
        "buildFinishedAt": a.build.finished_at,
    }


def groups(*, team: Team, ref: str, tags_limit: int, assignment_limit: int) -> dict[str, object]:
    """Each current tag of the template with its latest assignments, newest first."""
    template = _visible(team, ref)
    current = TemplateTag.objects.filter(template=template).order_by("-created_at", "tag")
    out = []
    for tag in current[:tags_limit]:
        rows = list(
            TagAssignment.objects.select_related("build")
            .filter(template=template, tag=tag.tag)
            .order_by("-id")[: assignment_limit + 1]
        )
        out.append(
            {
                "tag": tag.tag,
                "assignments": [_assignment(a) for a in rows[:assignment_limit]],
                "hasMore": len(rows) > assignment_limit,
            }
        )
    return {"tags": out, "nextCursor": None}


def assignments(*, team: Team, ref: str, tag: str, limit: int) -> dict[str, object]:
    template = _visible(team, ref)
    rows = TagAssignment.objects.select_related("build").filter(template=template, tag=tag.lower())
    return {"data": [_assignment(a) for a in rows.order_by("-id")[:limit]], "nextCursor": None}


def ready_builds(template: Template) -> int:
    return TemplateBuild.objects.filter(template=template, status=BuildStatus.READY).count()
