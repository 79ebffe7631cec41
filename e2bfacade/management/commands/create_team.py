"""``python manage.py create_team NAME``: a team (new or existing) and a fresh API key.

The raw key is printed once, as the last line of output, so scripts can capture it with
``tail -n 1``; only its hash is stored.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from e2bfacade.models import Team, api_key_create


class Command(BaseCommand):
    help = "Create a team (or reuse the one with this name) and print a new API key last."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="team name; an existing team is reused")
        parser.add_argument("--key-name", default="", help="label for the new key")

    def handle(self, *args: Any, name: str, key_name: str, **options: Any) -> None:
        name = name.strip()
        if not name:
            raise CommandError("the team name must not be empty")
        # Race-safe: team_name_unique lets the database arbitrate. get_or_create inserts
        # inside a savepoint and, on IntegrityError from a concurrent insert, reads the
        # winner's row instead, so two commands run at once end with one team.
        team, created = Team.objects.get_or_create(name=name)
        if team.system:
            raise CommandError(f"{name!r} is the service's own team; it has no API keys")
        verb = "Created" if created else "Reusing existing"
        self.stdout.write(f"{verb} team {team.name!r} (id {team.pk}).")
        key, raw = api_key_create(team=team, name=key_name)
        self.stdout.write(
            f"Created API key {key.prefix}… (id {key.pk}). "
            "It is stored hashed and shown only now, on the next line:"
        )
        self.stdout.write(raw)
