"""``python manage.py rotate_idempotency_keys``: re-encrypt every stored request and
response, and every other column encrypted with the same keys (a team's secret values:
``e2bfacade.crypto.ENCRYPTED_COLUMNS``), with the first key of IDEMPOTENCY_ENCRYPTION_KEYS
(run after adding a new key in front; then the old key can be removed)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import transaction

from e2bfacade import crypto
from idempotency.models import IdempotencyRecord


class Command(BaseCommand):
    help = "Re-encrypt stored idempotency bodies with the newest encryption key."

    def handle(self, *args: Any, **options: Any) -> None:
        n = 0
        last = 0
        while True:
            with transaction.atomic():
                # Wait for rows a claim holds (milliseconds) rather than skip them: a
                # skipped record would stay under the old key and be lost with it.
                batch = list(
                    IdempotencyRecord.objects.select_for_update()
                    .filter(pk__gt=last)
                    .order_by("pk")[:1000]
                )
                if not batch:
                    break
                for record in batch:
                    record.request_encrypted = crypto.rotate(record.request_encrypted)
                    fields = ["request_encrypted"]
                    if record.response_body_encrypted is not None:
                        record.response_body_encrypted = crypto.rotate(
                            record.response_body_encrypted
                        )
                        fields.append("response_body_encrypted")
                    record.save(update_fields=fields)
                last = batch[-1].pk
                n += len(batch)
        self.stdout.write(f"re-encrypted {n} idempotency records")
        for column in crypto.ENCRYPTED_COLUMNS:
            count = self._rotate_column(column)
            self.stdout.write(f"re-encrypted {count} {column.noun}")

    def _rotate_column(self, column: crypto.EncryptedColumn) -> int:
        model = apps.get_model(column.model)
        n = 0
        last: Any = None
        while True:
            with transaction.atomic():
                # Locked as above: a row written meanwhile under the old key would be lost
                # with it. An empty value (an erased one) has nothing to re-encrypt.
                rows = model.objects.select_for_update().exclude(**{column.field: b""})
                if last is not None:
                    rows = rows.filter(pk__gt=last)
                batch = list(rows.order_by("pk")[:1000])
                if not batch:
                    break
                for row in batch:
                    setattr(row, column.field, crypto.rotate(getattr(row, column.field)))
                    row.save(update_fields=[column.field])
                last = batch[-1].pk
                n += len(batch)
        return n
