"""The workload identity issuer's public documents and its signing keys: discovery and
JWKS answered without authentication, keys rotated on schedule (a replaced key stays
listed one more period, then is retired), private halves encrypted and covered by the key
rotation command. Minting and verification end to end: test_secret_egress.py."""

from __future__ import annotations

import base64
import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from sandboxes.identity import keys, tokens
from sandboxes.models import IdentityKey

pytestmark = pytest.mark.django_db


def test_discovery_and_jwks_are_public_and_name_this_issuer(settings: Any) -> None:
    settings.E2B_PUBLIC_API_URL = "https://api.example.test"
    client = Client()
    discovery = client.get("/.well-known/openid-configuration")
    assert discovery.status_code == 200
    body = discovery.json()
    assert body["issuer"] == "https://api.example.test"
    assert body["jwks_uri"] == "https://api.example.test/.well-known/jwks.json"
    assert body["id_token_signing_alg_values_supported"] == ["ES256"]
    jwks = client.get("/.well-known/jwks.json").json()
    (key,) = jwks["keys"]
    assert key["kty"] == "EC" and key["crv"] == "P-256" and key["alg"] == "ES256"
    assert "d" not in key  # the public half only
    # The key listed is the one the next token is signed with.
    token = tokens.mint(issuer="i", team_id=1, sandbox_id="s", audience="a")
    head = token.split(".")[0]
    assert json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))["kid"] == key["kid"]


def test_signing_keys_rotate_and_retire_on_schedule(settings: Any) -> None:
    settings.IDENTITY_KEY_ROTATION_DAYS = 1
    first, _ = keys.signing_key()
    assert keys.signing_key()[0] == first  # within the period: the same key
    IdentityKey.objects.filter(pk=first).update(created_at=timezone.now() - timedelta(days=1))
    second, _ = keys.signing_key()
    assert second != first
    listed = {k["kid"] for k in keys.jwks()["keys"]}
    assert listed == {first, second}  # tokens of the replaced key still verify
    IdentityKey.objects.filter(pk=first).update(created_at=timezone.now() - timedelta(days=2))
    IdentityKey.objects.filter(pk=second).update(created_at=timezone.now() - timedelta(days=1))
    third, _ = keys.signing_key()
    assert {k["kid"] for k in keys.jwks()["keys"]} == {second, third}
    assert IdentityKey.objects.get(pk=first).retired_at is not None


def test_identity_keys_are_encrypted_and_covered_by_the_key_rotation(settings: Any) -> None:
    keys.signing_key()
    (row,) = IdentityKey.objects.all()
    assert b"PRIVATE KEY" not in bytes(row.private_key_encrypted)
    out = io.StringIO()
    call_command("rotate_idempotency_keys", stdout=out)
    assert "re-encrypted 1 identity keys" in out.getvalue()
