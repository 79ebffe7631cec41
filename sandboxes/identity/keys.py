"""The issuer's signing keys: ES256 (P-256), one signing at a time, rotated every
``IDENTITY_KEY_ROTATION_DAYS``. A key that stops signing stays in the JWKS for one more
period (far longer than any token lives), then is retired. Keys are rows
(``sandboxes.models.IdentityKey``), the private half encrypted, so every process of the
service signs with the same key and publishes the same set."""

from __future__ import annotations

import base64
import secrets
from datetime import timedelta

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from e2bfacade import crypto
from sandboxes.models import IdentityKey


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signing_key() -> tuple[str, ec.EllipticCurvePrivateKey]:
    """(kid, key) of the key that signs now; made when there is none or the newest is due
    for rotation (then the keys older than one more period are retired). Concurrent
    callers may each make one: the newest wins, the other stays published until retired."""
    now = timezone.now()
    period = timedelta(days=settings.IDENTITY_KEY_ROTATION_DAYS)
    newest = IdentityKey.objects.filter(retired_at__isnull=True).order_by("-created_at").first()
    if newest is None or newest.created_at <= now - period:
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        kid = secrets.token_hex(8)
        try:
            with transaction.atomic():
                IdentityKey.objects.create(
                    kid=kid, private_key_encrypted=crypto.encrypt(pem), created_at=now
                )
                IdentityKey.objects.filter(
                    retired_at__isnull=True, created_at__lte=now - 2 * period
                ).update(retired_at=now)
        except IntegrityError:  # a kid collision (64 random bits): the next call makes one
            pass
        return kid, key
    loaded = serialization.load_pem_private_key(
        crypto.decrypt(newest.private_key_encrypted), password=None
    )
    assert isinstance(loaded, ec.EllipticCurvePrivateKey)
    return newest.kid, loaded


def jwks() -> dict[str, list[dict[str, str]]]:
    """The public halves of every listed key, as a JWK Set."""
    keys = []
    for row in IdentityKey.objects.filter(retired_at__isnull=True).order_by("-created_at"):
        private = serialization.load_pem_private_key(
            crypto.decrypt(row.private_key_encrypted), password=None
        )
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        numbers = private.public_key().public_numbers()
        keys.append(
            {
                "kty": "EC",
                "crv": "P-256",
                "alg": "ES256",
                "use": "sig",
                "kid": row.kid,
                "x": b64url(numbers.x.to_bytes(32, "big")),
                "y": b64url(numbers.y.to_bytes(32, "big")),
            }
        )
    return {"keys": keys}
