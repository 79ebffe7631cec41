"""Template writes: import a rootfs tarball as a template."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from e2bfacade.models import Team
from sandboxes.runtime import get_runtime
from sandboxes.runtime.base import check_id
from templates.models import Template, new_template_id


class TemplateExists(Exception):
    pass


def template_import(
    *,
    alias: str,
    tar_path: str,
    team: Team | None = None,
    cpu_count: int = 2,
    memory_mb: int = 512,
    disk_size_mb: int = 1024,
) -> Template:
    """Unpack ``tar_path`` into a new runtime image and register it under ``alias``.

    The image is built first (no transaction is open during the slow part); the row is
    inserted last, and if that fails the image is deleted again, so a failure leaves nothing.
    """
    check_id(alias, "template name")
    if Template.objects.filter(team=team, alias=alias).exists():
        raise TemplateExists(f"a template named {alias!r} already exists")
    template_id = new_template_id()
    runtime = get_runtime()
    image = runtime.import_image(template_id, tar_path)
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
