"""``python manage.py purge_idempotency_keys [--dry-run] [--batch-size N]``."""

from __future__ import annotations

import time
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from idempotency.maintenance import purge_expired


class Command(BaseCommand):
    help = (
        "Delete idempotency records past retention (IDEMPOTENCY_TTL_SECONDS), in batches. "
        "Never deletes an in-progress record whose lease is live. Safe beside traffic."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument("--batch-size", type=int, default=10_000)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch_size"] < 1:
            self.stderr.write("--batch-size must be at least 1")
            raise SystemExit(2)
        started = time.monotonic()
        n = purge_expired(batch_size=options["batch_size"], dry_run=options["dry_run"])
        elapsed = time.monotonic() - started
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(f"{verb} {n} expired idempotency records in {elapsed:.2f}s")
