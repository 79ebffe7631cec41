"""Template writes: import a rootfs tarball, delete a template or snapshot, sweep images."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import IO

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from e2bfacade.errors import ApiError, BadRequest, NotFound
from e2bfacade.models import Team, system_team
from e2bfacade.runtime.base import (
    BUILTIN_IMAGE,
    MIN_DISK_MB,
    Capacity,
    ImageInUse,
    SandboxRuntimeError,
    check_id,
)
from nodes.selectors import local_node, local_runtime, node_capacity, runtime_for
from templates import code_interpreter
from templates.builds import caches as build_caches
from templates.builds import files as build_files
from templates.builds import tags as tagging
from templates.builds import worker
from templates.builds.services import build_submit_system
from templates.models import (
    DEFAULT_TAG,
    BuildLogEntry,
    BuildStatus,
    LayerCacheEntry,
    Template,
    TemplateBuild,
    TemplateTag,
    new_template_id,
)

logger = logging.getLogger(__name__)
ORPHAN_IMAGE_GRACE_SECONDS = 3600


class Forbidden(ApiError):
    status = 403


class TemplateExists(Exception):
    pass


DEFAULT_PIDS_MAX = 1024  # Template.pids_max's default: an imported template's


def template_fits(
    cap: Capacity,
    *,
    name: str,
    cpu_count: int,
    memory_mb: int,
    pids_max: int,
    disk_size_mb: int,
) -> None:
    """Raise BadRequest unless one sandbox of this shape can run on a host of ``cap``."""
    for what, asked, has in (
        ("CPUs", cpu_count, cap.cpus),
        ("MiB of memory", memory_mb, cap.memory_mb),
        ("processes", pids_max, cap.pids),
        ("MiB of disk", disk_size_mb, cap.disk_mb),
    ):
        if asked > has:
            raise BadRequest(
                f"template '{name}' asks for {asked} {what}; this host can give a sandbox "
                f"at most {has}"
            )
    if disk_size_mb < MIN_DISK_MB:
        raise BadRequest(
            f"template '{name}' asks for {disk_size_mb} MiB of disk; a sandbox's disk is at "
            f"least {MIN_DISK_MB} MiB"
        )


def template_import(
    *,
    alias: str,
    archive: IO[bytes],
    team: Team | None = None,
    cpu_count: int = 2,
    memory_mb: int = 512,
    disk_size_mb: int = 1024,
) -> Template:
    """Unpack the rootfs tarball read from ``archive`` into a new runtime image and register
    it under ``alias``.

    The image is built first (no transaction is open during the slow part); the row is
    inserted last, and if that fails the image is deleted again, so a failure leaves nothing.
    """
    check_id(alias, "template name")
    if Template.objects.filter(team=team, alias=alias).exists():
        raise TemplateExists(f"a template named {alias!r} already exists")
    template_id = new_template_id()
    node = local_node()
    runtime = runtime_for(node)
    template_fits(
        node_capacity(node),
        name=alias,
        cpu_count=cpu_count,
        memory_mb=memory_mb,
        pids_max=DEFAULT_PIDS_MAX,
        disk_size_mb=disk_size_mb,
    )
    image = runtime.import_image(template_id, archive)
    try:
        with transaction.atomic():
            return Template.objects.create(
                template_id=template_id,
                team=team,
                alias=alias,
                image_id=image.image_id,
                cpu_count=cpu_count,
                memory_mb=memory_mb,
                disk_size_mb=disk_size_mb,
                size_bytes=image.size_bytes,
            )
    except IntegrityError:
        runtime.delete_image(template_id)
        raise TemplateExists(f"a template named {alias!r} already exists") from None
    except BaseException:
        runtime.delete_image(template_id)
        raise


def template_resolve_owned(*, team: Team, ref: str, verb: str = "deleted") -> Template:
    """A template the team may delete or publish: its own, by id or alias. Team-less public
    ones are refused (403); another team's, published or not, is not found."""
    template = Template.objects.resolve(team.pk, ref)
    if template is None or template.kind == Template.Kind.FORK:
        raise NotFound(f"template '{ref}' not found")
    if template.team_id is None:
        raise Forbidden(f"template '{ref}' is public and cannot be {verb} through the API")
    return template


def template_publish(*, team: Team, ref: str, public: bool | None) -> Template:
    """``PATCH /templates/{id}``: publish (other teams may then start it, by its id) or
    unpublish the team's own template. ``None`` changes nothing. 404 for another team's
    (or unknown) template, 403 for a team-less public one, 400 for a snapshot. Setting
    the value it has is a no-op, so a repeat answers the same."""
    template = template_resolve_owned(team=team, ref=ref, verb="changed")
    if template.kind != Template.Kind.TEMPLATE:
        raise BadRequest(f"'{ref}' is a snapshot: only templates can be published")
    if public is not None and template.public != public:
        # A plain UPDATE of one column: nothing else of the row may be overwritten by a
        # concurrent build finishing (it moves image_id and the shape).
        Template.objects.filter(pk=template.pk).update(public=public, updated_at=timezone.now())
        template.public = public
    return template


def template_delete(*, team: Team, ref: str) -> None:
    """Delete a template or snapshot, and its runtime image unless something else may still
    use it (see :func:`_delete_image_unless_used`). 204 once, then 404; 400 while a sandbox
    still uses it. Concurrent deletes converge: the row lock admits one, the runtime's delete
    is idempotent, and the other finds no row (404)."""
    with transaction.atomic():
        # Lock first so no create can reserve a sandbox on it while we check and delete.
        template = template_resolve_owned(team=team, ref=ref)
        locked = Template.objects.select_for_update().filter(pk=template.pk).first()
        if locked is None:  # a concurrent delete won the race
            raise NotFound(f"template '{ref}' not found")
        template = locked
        users = template.sandboxes.exclude(state="killed").count()
        if users:
            raise BadRequest(
                f"template '{ref}' is still used by {users} sandbox(es); kill them first"
            )
        template.delete()
    _delete_image_unless_used(team, template.image_id)


def _delete_image_unless_used(team: Team, image_id: str) -> None:
    """Delete ``image_id`` now when no row of any team names it (a template, a build, a
    cached layer) and none of the team's builds is running; otherwise leave it to
    :func:`template_sweep_images`, which removes it once nothing names it.

    Builds share images: two templates of one recipe end on one cached image, and a running
    build may have just taken a cached layer (or this template as its base) that it has not
    recorded yet. Only the team's own builds can reach its images (build images are named
    in the team's namespace), so another team's builds need not be waited for."""
    if not image_id:
        return
    named = (
        Template.objects.filter(image_id=image_id).exists()
        or TemplateBuild.objects.filter(image_id=image_id).exists()
        or LayerCacheEntry.objects.filter(image_id=image_id).exists()
    )
    building = TemplateBuild.objects.filter(team=team, status=BuildStatus.BUILDING).exists()
    if named or building:
        logger.info("image %s left to the sweep: it may still be in use", image_id)
        return
    try:
        local_runtime().delete_image(image_id)
    except ImageInUse as exc:
        # Another image is layered on it (a snapshot of a sandbox started from this one).
        # The row is gone, so the worker's image sweep removes it once that one goes.
        logger.info("image %s kept for now: %s", image_id, exc.message)


def template_sweep_images() -> list[str]:
    """Delete runtime images no template row names (left by a delete that found the image
    still layered under another), and fork templates no live sandbox uses any more."""
    removed = []
    for template in Template.objects.filter(kind=Template.Kind.FORK):
        with transaction.atomic():
            locked = (
                Template.objects.select_for_update(skip_locked=True).filter(pk=template.pk).first()
            )
            if locked is None or locked.sandboxes.exclude(state="killed").exists():
                continue
            locked.delete()
    for files_hash in build_files.sweep():
        logger.info("removed the unused build archive %s", files_hash)
    for path in build_caches.prune_all():
        logger.info("pruned the cache entry %s", path)
    runtime = local_runtime()
    # An image is built before its template row is inserted (no transaction spans the
    # build): only an image older than the grace period can be an orphan.
    cutoff = time.time() - ORPHAN_IMAGE_GRACE_SECONDS
    known = set(Template.objects.values_list("image_id", flat=True))
    # A build's image (a tag may point at it) and the team's cached layers.
    known |= set(TemplateBuild.objects.exclude(image_id="").values_list("image_id", flat=True))
    known |= set(LayerCacheEntry.objects.values_list("image_id", flat=True))
    for image_id in runtime.list_images():
        if image_id in known or image_id == BUILTIN_IMAGE:
            continue
        if runtime.image_info(image_id).created_at > cutoff:
            continue
        try:
            if runtime.delete_image(image_id):
                removed.append(image_id)
        except ImageInUse:
            continue
    return removed


@dataclass(frozen=True)
class CodeInterpreterBuilt:
    template: Template
    build: TemplateBuild
    fresh: bool  # False: a build of these inputs was there already
    seconds: float


def template_build_code_interpreter() -> CodeInterpreterBuilt:
    """Build ``code-interpreter-v1`` with the template pipeline unless a ready build of the
    same inputs exists (then nothing is built: its tag ``inputs-<digest>`` finds it), and
    point the public template at it. The build is the system team's (no API key reaches
    it); this process runs it unless a build worker took it first, and waits for it either
    way. Its packages are fetched on the host (downloads only, kept by the inputs' digest in
    TEMPLATE_CACHE_DIR) and installed in the build sandbox. Raises BuildFailed with the
    build's reason and its last log lines; a failed build leaves the template as it was."""
    template_fits(
        node_capacity(local_node()),
        name=code_interpreter.ALIAS,
        cpu_count=code_interpreter.CPU_COUNT,
        memory_mb=code_interpreter.MEMORY_MB,
        pids_max=DEFAULT_PIDS_MAX,
        disk_size_mb=code_interpreter.DISK_MB,
    )
    code_interpreter.check_host()
    began = time.monotonic()
    digest = code_interpreter.inputs_digest()
    inputs_tag = f"inputs-{digest[:16]}"
    template = _public_template()
    done = _built(template, inputs_tag)
    if done is not None:
        if template.image_id != done.image_id:  # the inputs changed and changed back
            with transaction.atomic():
                tagging.point(template, done, [DEFAULT_TAG])
            template.refresh_from_db()
        return CodeInterpreterBuilt(template, done, False, time.monotonic() - began)
    context = code_interpreter.context(settings.TEMPLATE_CACHE_DIR / "code-interpreter", digest)
    body = code_interpreter.spec(context)
    team = system_team()
    # The COPY archives, put in the team's store as the SDK uploads them (unless there).
    for step in body["steps"]:
        if step["type"] == "COPY" and not build_files.present(team, step["filesHash"]):
            with code_interpreter.archive(context, step["args"][0]) as archive:
                size = os.fstat(archive.fileno()).st_size
                build_files.store_own(team.pk, step["filesHash"], archive, size)
    build = build_submit_system(
        template=template,
        team=team,
        body=body,
        tags=[DEFAULT_TAG, inputs_tag],
        cpu_count=code_interpreter.CPU_COUNT,
        memory_mb=code_interpreter.MEMORY_MB,
    )
    _drive(build)
    build.refresh_from_db()
    if build.status != BuildStatus.READY:
        reason = (build.reason or {}).get("message", build.status)
        said = BuildLogEntry.objects.filter(build=build).order_by("-seq")[:15]
        tail = "\n".join(e.message for e in reversed(said))
        raise code_interpreter.BuildFailed(f"build {build.build_id} failed: {reason}\n{tail}")
    template.refresh_from_db()
    return CodeInterpreterBuilt(template, build, True, time.monotonic() - began)


def _public_template() -> Template:
    """``code-interpreter-v1``'s row, made (without an image: a create answers that it is
    not built) on first use."""
    try:
        template, _ = Template.objects.get_or_create(
            template_id=code_interpreter.ALIAS,
            defaults={
                "alias": code_interpreter.ALIAS,
                "team": None,
                "image_id": "",
                "cpu_count": code_interpreter.CPU_COUNT,
                "memory_mb": code_interpreter.MEMORY_MB,
                "disk_size_mb": code_interpreter.DISK_MB,
            },
        )
    except IntegrityError:  # a concurrent first build made it
        template = Template.objects.get(template_id=code_interpreter.ALIAS)
    return template


def _built(template: Template, inputs_tag: str) -> TemplateBuild | None:
    """The ready build the inputs' tag points at, if its image is still on this host."""
    tag = TemplateTag.objects.select_related("build").filter(template=template, tag=inputs_tag)
    found = tag.first()
    if found is None or found.build.status != BuildStatus.READY:
        return None
    try:
        local_runtime().image_info(found.build.image_id)
    except SandboxRuntimeError:
        return None  # swept, or another host's root
    return found.build


def _drive(build: TemplateBuild) -> None:
    """Run ``build`` here unless a build worker holds it; return once it has ended. A
    worker's lease that runs out (it died) is taken over here, as a worker would."""
    owner = worker.new_owner()
    while True:
        claimed = worker.claim_build(build.pk, owner)
        if claimed is not None:
            worker.run(claimed, owner)
        status = TemplateBuild.objects.filter(pk=build.pk).values_list("status", flat=True)
        if status.first() != BuildStatus.BUILDING:
            return
        time.sleep(1.0)
