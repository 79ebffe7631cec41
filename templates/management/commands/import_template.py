"""``python manage.py import_template NAME ROOTFS.tar``: a rootfs tarball becomes a template."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from e2bfacade.errors import ApiError
from e2bfacade.models import Team
from e2bfacade.runtime.base import SandboxRuntimeError
from templates.services import TemplateExists, template_import


class Command(BaseCommand):
    help = "Import a root file system tarball as a template usable as templateID."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("name", help="the template's alias, e.g. python-3.12")
        parser.add_argument("rootfs", help="path to a .tar (optionally .gz/.xz) of a root fs")
        parser.add_argument("--team", help="make it private to this team (default: public)")
        parser.add_argument("--cpu-count", type=int, default=2)
        parser.add_argument("--memory-mb", type=int, default=512)
        parser.add_argument("--disk-size-mb", type=int, default=1024)

    def handle(self, *args: Any, **options: Any) -> None:
        team = None
        if options["team"]:
            team = Team.objects.filter(name=options["team"]).first()
            if team is None:
                raise CommandError(f"no team named {options['team']!r}")
        try:
            with open(options["rootfs"], "rb") as archive:
                template = template_import(
                    alias=options["name"],
                    archive=archive,
                    team=team,
                    cpu_count=options["cpu_count"],
                    memory_mb=options["memory_mb"],
                    disk_size_mb=options["disk_size_mb"],
                )
        except OSError as exc:
            raise CommandError(f"cannot read {options['rootfs']!r}: {exc.strerror}") from exc
        except (TemplateExists, SandboxRuntimeError) as exc:
            raise CommandError(str(exc)) from exc
        except ApiError as exc:  # the host cannot hold a sandbox of this shape
            raise CommandError(exc.message) from exc
        self.stdout.write(f"imported {template.alias} as template {template.template_id}")
