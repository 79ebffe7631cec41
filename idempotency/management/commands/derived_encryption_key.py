"""``python manage.py derived_encryption_key``: print the Fernet key stored idempotency
bodies are encrypted with when ``IDEMPOTENCY_ENCRYPTION_KEYS`` is unset (the one derived
from this ``SECRET_KEY``). Run it before changing ``SECRET_KEY``, then set
``IDEMPOTENCY_ENCRYPTION_KEYS=NEW,<this>`` and rotate
(docs/idempotency.md, "Idempotency contract")."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from e2bfacade import crypto


class Command(BaseCommand):
    help = "Print the body-encryption key derived from this SECRET_KEY."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(crypto.derived_key(settings.SECRET_KEY))
