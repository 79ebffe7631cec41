"""Minting a sandbox's workload tokens: JWTs signed ES256 by the issuer's current key.

Claims: ``iss`` the issuer the sandbox was created under, ``sub``
``team:<team id>:sandbox:<sandbox id>``, ``aud`` the audience its ``iam`` asked for (as
given), ``iat``/``nbf``/``exp`` (``IDENTITY_TOKEN_SECONDS`` long), a random ``jti``, and
``e2b_sandbox_id`` / ``e2b_team_id``. Minted for each request that needs one, by the egress
proxy's resolver only: no API returns a token."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from django.conf import settings

from sandboxes.identity.keys import b64url, signing_key

TOKEN_TYPES = ("JWT-SVID",)  # E2B's: the one type its API accepts


def subject(team_id: int, sandbox_id: str) -> str:
    return f"team:{team_id}:sandbox:{sandbox_id}"


def mint(*, issuer: str, team_id: int, sandbox_id: str, audience: str) -> str:
    kid, key = signing_key()
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": issuer,
        "sub": subject(team_id, sandbox_id),
        "aud": audience,
        "iat": now,
        "nbf": now - 5,
        "exp": now + settings.IDENTITY_TOKEN_SECONDS,
        "jti": secrets.token_hex(16),
        "e2b_sandbox_id": sandbox_id,
        "e2b_team_id": str(team_id),
    }
    header = {"alg": "ES256", "typ": "JWT", "kid": kid}
    signing_input = (
        b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + b64url(json.dumps(claims, separators=(",", ":")).encode())
    )
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return signing_input + "." + b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))
