"""``python manage.py create_access_token TEAM``: a new access token for an existing team.

An access token manages the team's API keys and tokens through E2B's routes
(``Authorization: Bearer``); it starts no sandbox. The raw token is printed once, as the
last line of output, so scripts can capture it with ``tail -n 1``; only its hash is stored.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from e2bfacade import history
from e2bfacade.models import Team, access_token_mint


class Command(BaseCommand):
    help = "Create an access token for a team (by name or id) and print it last."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("team", help="the team's name, or its id (teamID)")
        parser.add_argument("--name", default="manage.py", help="label for the new token")

    def handle(self, *args: Any, team: str, name: str, **options: Any) -> None:
        found = Team.objects.filter(name=team).first() or Team.objects.by_wire_id(team)
        if found is None:
            raise CommandError(f"no team named {team!r} (make one with create_team)")
        token, raw = access_token_mint(team=found, name=name.strip() or "manage.py")
        history.record(obj=token, action=history.ADDITION, message="Created", actor="manage.py")
        self.stdout.write(
            f"Created access token {token.pk} for team {found.name!r} (teamID {found.pk}). "
            "It is stored hashed and shown only now, on the next line:"
        )
        self.stdout.write(raw)
