"""Encryption at rest (Fernet, with rotation): idempotency's stored requests and responses,
a template build's registry credentials until the build ends, the values of a team's secrets.

``IDEMPOTENCY_ENCRYPTION_KEYS`` is a comma-separated list of Fernet keys, newest first:
new data is encrypted with the first, and any listed key decrypts. To rotate, put a new key
first, run ``manage.py rotate_idempotency_keys``, then drop the old key. Unset, one key is
derived from SECRET_KEY — only from a real one: with the built-in insecure SECRET_KEY (public,
so anyone could derive the key) there is no default key: encrypting and decrypting raise
ImproperlyConfigured, and the service refuses to start (e2bfacade/startup.py).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from e2bfacade.startup import ENCRYPTION_KEY_REFUSED, is_insecure_secret_key


def derived_key(secret: str) -> str:
    """The Fernet key used when IDEMPOTENCY_ENCRYPTION_KEYS is unset: derived from
    ``secret`` (a real SECRET_KEY). Printed by ``manage.py derived_encryption_key`` so an
    operator changing SECRET_KEY can keep the old one readable while rotating."""
    digest = hashlib.sha256(b"e2bfacade.idempotency:" + secret.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()


@functools.cache
def _fernet(keys: tuple[str, ...], secret: str) -> MultiFernet:
    if not keys:
        if is_insecure_secret_key(secret):
            raise ImproperlyConfigured(ENCRYPTION_KEY_REFUSED)
        keys = (derived_key(secret),)
    try:
        return MultiFernet([Fernet(k) for k in keys])
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            "IDEMPOTENCY_ENCRYPTION_KEYS must be Fernet keys (32 url-safe base64 bytes); "
            "make one with: python -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())'"
        ) from exc


@dataclass(frozen=True)
class EncryptedColumn:
    """A column of another app encrypted with these keys: ``model`` (an ``app.Model``
    label) stores Fernet tokens in ``field`` (an empty value: nothing stored). Registered
    at that app's ``ready()`` so the key rotation re-encrypts it without importing it."""

    model: str
    field: str
    noun: str  # what the rotation reports it re-encrypted ("secret versions")


ENCRYPTED_COLUMNS: list[EncryptedColumn] = []


def register_encrypted_column(column: EncryptedColumn) -> None:
    if column not in ENCRYPTED_COLUMNS:
        ENCRYPTED_COLUMNS.append(column)


def fernet() -> MultiFernet:
    return _fernet(tuple(settings.IDEMPOTENCY_ENCRYPTION_KEYS), settings.SECRET_KEY)


def encrypt(data: bytes) -> bytes:
    return fernet().encrypt(data)


def decrypt(token: bytes | memoryview) -> bytes:
    try:
        return fernet().decrypt(bytes(token))
    except InvalidToken as exc:
        raise ImproperlyConfigured(
            "a stored idempotency body cannot be decrypted: its key is no longer in "
            "IDEMPOTENCY_ENCRYPTION_KEYS"
        ) from exc


def rotate(token: bytes | memoryview) -> bytes:
    return fernet().rotate(bytes(token))
