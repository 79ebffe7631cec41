"""``python manage.py seed_registry --registry http://127.0.0.1:5055``: build this
service's Debian bases (templates/builds/debian.py) and push them to a registry:
``library/debian:bookworm`` (and ``:12``), ``e2bdev/base:latest``, and, with
``--ubuntu-substitute``, the Debian image as ``library/ubuntu:22.04``.

The first run downloads from Debian's mirror (mmdebstrap); later ones take the cached
tarballs and images (``TEMPLATE_CACHE_DIR/bases``) and push in seconds.
``--build-only`` fills the cache and pushes nothing."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from templates.builds import debian


class Command(BaseCommand):
    help = "Build the Debian bases for E2B's base image names and push them to a registry."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--registry", help="http://host:port (plain HTTP) or https://…")
        parser.add_argument(
            "--ubuntu-substitute",
            action="store_true",
            help="also push the Debian bookworm image as library/ubuntu:22.04 (a substitution)",
        )
        parser.add_argument(
            "--build-only", action="store_true", help="fill the cache; push nothing"
        )
        parser.add_argument(
            "--offline",
            action="store_true",
            help="never run mmdebstrap: fail if a base is not cached",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        cache_dir = settings.TEMPLATE_CACHE_DIR / "bases"

        def say(line: str) -> None:
            self.stdout.write(line)

        try:
            if options["build_only"]:
                for recipe in debian.RECIPES:
                    layout = debian.oci_layout(
                        recipe, cache_dir=cache_dir, offline=options["offline"], log=say
                    )
                    say(f"{recipe.name}: {layout}")
                return
            if not options["registry"]:
                raise CommandError("--registry is required (or --build-only)")
            seeded = debian.seed(
                options["registry"],
                cache_dir=cache_dir,
                ubuntu_substitute=options["ubuntu_substitute"],
                offline=options["offline"],
                log=say,
            )
        except debian.BaseBuildFailed as exc:
            raise CommandError(exc.message) from exc
        for item in seeded:
            label = " (SUBSTITUTION: Debian, not Ubuntu)" if item.substitute else ""
            say(f"{options['registry']}/{item.name}: {item.recipe} {item.digest}{label}")
