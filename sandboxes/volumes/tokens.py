"""Volume tokens: what the content API demands (``Authorization: Bearer <token>``), never
the API key. A token is an HMAC, under a key derived from SECRET_KEY, over the volume's id,
its token epoch and an expiry: it names one volume, lapses after VOLUME_TOKEN_SECONDS, and
every token of a volume is revoked at once by raising its epoch (the admin's "revoke
tokens"). ``GET /volumes/{id}`` mints a fresh one; earlier ones stay valid until they lapse
or are revoked. Verifying needs the volume's row (its epoch), nothing stored per token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid

from django.conf import settings

PREFIX = "e2bvol_"


def _key() -> bytes:
    return hashlib.sha256(b"e2bfacade.volume-token:" + settings.SECRET_KEY.encode()).digest()


def _sign(payload: bytes) -> str:
    digest = hmac.new(_key(), payload, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def mint(volume_id: uuid.UUID, epoch: int, *, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + settings.VOLUME_TOKEN_SECONDS)
    payload = f"{volume_id.hex}.{epoch}.{expires}".encode()
    body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{PREFIX}{body}.{_sign(payload)}"


def verify(token: str, volume_id: uuid.UUID, epoch: int, *, now: float | None = None) -> bool:
    """True when ``token`` was minted for this volume in this epoch and has not lapsed."""
    if not isinstance(token, str) or not token.startswith(PREFIX) or len(token) > 256:
        return False
    body, _, signature = token[len(PREFIX) :].partition(".")
    try:
        payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, TypeError):
        return False
    if not hmac.compare_digest(_sign(payload), signature):
        return False
    try:
        hex_id, epoch_text, expires_text = payload.decode().split(".")
        expires = int(expires_text)
        minted_epoch = int(epoch_text)
    except ValueError:
        return False
    current = time.time() if now is None else now
    return hex_id == volume_id.hex and minted_epoch == epoch and current < expires
