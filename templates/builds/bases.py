"""Where a build starts: ``fromTemplate`` (a template or ``name:tag`` the team can use: its
image and final context, no copy) or ``fromImage`` (an OCI image pulled from its registry,
or from TEMPLATE_REGISTRY_MIRROR when set, and kept as a runtime image per pull cache entry:
per image and digest, and per team for a pull with credentials; see :mod:`.registry`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from nodes.selectors import local_runtime
from templates.builds import images, names, registry
from templates.builds import tags as tagging
from templates.builds.executor import Base
from templates.builds.steps import DEFAULT_USER, Context
from templates.models import Template, TemplateTag


class BaseUnavailable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def resolve(*, team_id: int, spec: dict[str, Any], auth: dict[str, Any] | None) -> Base:
    if spec.get("fromTemplate"):
        return _from_template(team_id, str(spec["fromTemplate"]))
    return _from_image(team_id, str(spec["fromImage"]), auth)


def _from_template(team_id: int, ref: str) -> Base:
    found = tagging.resolve(team_id, ref)
    if found is None:
        if ":" in ref:
            name = names.parse(ref)
            template = Template.objects.resolve(team_id, name.name)
            if (
                template is not None
                and not TemplateTag.objects.filter(
                    template=template, tag=name.tag_or_default
                ).exists()
            ):
                raise BaseUnavailable(
                    f"tag '{name.tag_or_default}' does not exist for template '{name.name}'"
                )
        raise BaseUnavailable(f"template '{ref}' not found")
    if not found.image_id:
        raise BaseUnavailable(f"template '{ref}' has no ready build")
    build = found.build
    if build is None:
        build = found.template.builds.filter(image_id=found.image_id).first()
    context = (
        Context.from_json(build.context)
        if build is not None and build.context
        else Context(user=DEFAULT_USER)
    )
    source = str(build.build_id) if build is not None else found.image_id
    return Base(
        image_id=found.image_id,
        key=f"template:{source}",
        context=context,
        label=f"TEMPLATE {ref}",
        default_user_phase=False,
    )


def _from_image(team_id: int, ref: str, auth: dict[str, Any] | None) -> Base:
    try:
        pulled = registry.pull(
            ref,
            auth=registry.RegistryAuth.from_wire(auth),
            mirror=settings.TEMPLATE_REGISTRY_MIRROR,
            cache_dir=settings.TEMPLATE_PULL_CACHE_DIR,
            team_id=team_id,
            allow=settings.TEMPLATE_REGISTRY_ALLOW,
            max_mb=settings.TEMPLATE_IMAGE_MAX_MB,
        )
        # Named by the cache entry: pulled with credentials, the image is the team's own.
        image_id = images.image_id_for(pulled)
        info = images.import_pulled(local_runtime(), image_id, pulled)
    except registry.PullFailed as exc:
        raise BaseUnavailable(exc.message) from None
    return Base(
        image_id=info.image_id,
        key=f"{ref}@{pulled.digest}",
        context=Context(user="root", workdir=None, env=dict(pulled.env)),
        label=ref,
        default_user_phase=True,
    )
