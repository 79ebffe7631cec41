"""Where a build starts: ``fromTemplate`` (a template or ``name:tag`` the team can use: its
image and final context, no copy) or ``fromImage`` (an OCI image pulled from its registry,
or from TEMPLATE_REGISTRY_MIRROR when set, and kept as a runtime image per digest: see
:mod:`.registry`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from e2bfacade.sandbox_runtime import get_runtime
from templates.builds import names
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
    from templates.builds import registry  # type: ignore[attr-defined]

    mirror = settings.TEMPLATE_REGISTRY_MIRROR or None
    try:
        pulled = registry.pull(
            ref, auth=registry.auth_from(auth), mirror=mirror, cache_dir=registry.cache_dir()
        )
        # Pulled with credentials: the team's own (another team must not get it unasked).
        scope = f"t{team_id}-" if auth else ""
        image_id = f"oci-{scope}{pulled.digest.split(':')[-1][:24]}"
        info = registry.import_pulled(get_runtime(), image_id, pulled)
    except registry.PullFailed as exc:
        raise BaseUnavailable(exc.message) from None
    return Base(
        image_id=info.image_id,
        key=f"{ref}@{pulled.digest}",
        context=Context(user="root", workdir=None, env=dict(pulled.env)),
        label=ref,
        default_user_phase=True,
    )
