"""``python manage.py build_code_interpreter``: the ``code-interpreter-v1`` template."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from e2bfacade.errors import ApiError
from e2bfacade.models import SystemTeamTaken
from e2bfacade.runtime.base import SandboxRuntimeError
from templates.code_interpreter import BuildFailed
from templates.services import template_build_code_interpreter


class Command(BaseCommand):
    help = (
        "Build the code-interpreter-v1 template (Python, Jupyter kernels, the data stack and "
        "the execution service on port 49999) with the template pipeline, in a build "
        "sandbox, unless a build of the same inputs is there."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            built = template_build_code_interpreter()
        except (BuildFailed, SandboxRuntimeError, SystemTeamTaken) as exc:
            raise CommandError(f"cannot build code-interpreter-v1: {exc}") from exc
        except ApiError as exc:  # the host cannot hold a sandbox of its shape
            raise CommandError(exc.message) from exc
        template = built.template
        if built.fresh:
            self.stdout.write(
                f"built {template.alias}: build {built.build.build_id}, image "
                f"{template.image_id}, in {built.seconds:.1f} s"
            )
        else:
            self.stdout.write(
                f"{template.alias} is built: build {built.build.build_id}, image "
                f"{template.image_id}"
            )
