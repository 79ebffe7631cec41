"""``python manage.py build_code_interpreter``: the ``code-interpreter-v1`` template."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from e2bfacade.errors import ApiError
from e2bfacade.runtime.base import SandboxRuntimeError
from templates.code_interpreter import BuildFailed
from templates.services import template_build_code_interpreter


class Command(BaseCommand):
    help = (
        "Build the code-interpreter-v1 template (Python, Jupyter kernels, the data stack and "
        "the execution service on port 49999) from Debian's python3 and PyPI, unless built."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            template, built = template_build_code_interpreter()
        except (BuildFailed, SandboxRuntimeError) as exc:
            raise CommandError(f"cannot build code-interpreter-v1: {exc}") from exc
        except ApiError as exc:  # the host cannot hold a sandbox of its shape
            raise CommandError(exc.message) from exc
        size = built.image.size_bytes / 1e6
        if built.fresh:
            self.stdout.write(
                f"built {template.alias}: image {built.image.image_id}, {size:.0f} MB, "
                f"in {built.seconds:.1f} s"
            )
        else:
            self.stdout.write(f"{template.alias} is built: image {built.image.image_id}")
