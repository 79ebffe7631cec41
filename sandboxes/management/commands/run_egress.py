"""``python manage.py run_egress SANDBOX_ROOT [NETWORK_JSON]``: the egress proxy
(``e2bfacade/runtime/local/net/egress.py``) with the service's resolver of placeholders,
so transform rules can name the team's secrets. ``manage.py serve`` starts it.

The proxy itself knows nothing of Django: it is handed one function,
``sandboxes.secrets.selectors.placeholder_value``, which it calls off its event loop, once
per placeholder per request; the value it answers lives only in the request it is written
into (and the masker of that connection), never on disk or in a log."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from e2bfacade.runtime.local.net import egress
from sandboxes.secrets.selectors import placeholder_value


def resolve(sandbox_id: str, kind: str, name: str) -> str | None:
    # Each executor thread keeps its own connection; one dropped by the database (a
    # restart) is replaced rather than failing every later request of that thread.
    close_old_connections()
    try:
        return placeholder_value(sandbox_id, kind, name)
    except Exception:  # noqa: BLE001 - a failed lookup drops the header, never the proxy
        egress.log.exception("egress: resolving a placeholder failed")
        return None


class Command(BaseCommand):
    help = "Run the egress proxy of SANDBOX_ROOT with the secrets resolver."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("root")
        parser.add_argument("network_json", nargs="?")

    def handle(self, *args: Any, **options: Any) -> None:
        argv = [options["root"]] + ([options["network_json"]] if options["network_json"] else [])
        code = egress.main(argv, resolve)
        if code:
            raise CommandError(f"the egress proxy exited with {code}", returncode=code)
