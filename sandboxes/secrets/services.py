"""Secret writes: create, a new version, revoke. Each is one short transaction and no
runtime call: the egress proxy reads a secret's current value when a request needs it
(``selectors.secret_value``), so nothing has to be pushed anywhere when one changes.

A value is encrypted before it reaches the database and appears in no message, log line
or response: errors name the secret (its id or name), never what it holds."""

from __future__ import annotations

import re

from django.db import IntegrityError, transaction
from django.utils import timezone

from e2bfacade import crypto
from e2bfacade.errors import BadRequest, Conflict
from e2bfacade.models import Team
from sandboxes.models import Secret, SecretVersion
from sandboxes.secrets.selectors import ID_PREFIX, secret_get

SECRET_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")  # E2B's NewSecret.name


def canonical_name(name: str) -> str:
    """E2B's canonical form (lower-case), or a 400 in E2B's terms."""
    if not SECRET_NAME.fullmatch(name):
        raise BadRequest("secret name must be 1-128 characters of letters, digits, '_' and '-'")
    canonical = name.lower()
    if canonical.startswith(ID_PREFIX):
        raise BadRequest(f"secret names must not start with '{ID_PREFIX}': it marks secret IDs")
    return canonical


def secret_create(
    *, team: Team, name: str, value: str, metadata: dict[str, str] | None = None
) -> Secret:
    """A new secret at version 1. A live secret of the team with the same canonical name:
    409 (the database arbitrates, so two concurrent creates make one). Not idempotent: a
    retry after a lost answer gets the 409, and the caller reads the secret by name."""
    canonical = canonical_name(name)
    now = timezone.now()
    try:
        with transaction.atomic():
            secret = Secret.objects.create(
                team=team,
                name=canonical,
                metadata=metadata or {},
                created_at=now,
                updated_at=now,
            )
            SecretVersion.objects.create(
                secret=secret,
                version=1,
                value_encrypted=crypto.encrypt(value.encode()),
                created_at=now,
            )
    except IntegrityError:
        raise Conflict(f"secret '{canonical}' already exists") from None
    return secret


def secret_update(
    *, team: Team, selector: str, value: str, metadata: dict[str, str] | None = None
) -> Secret:
    """Append ``value`` as the secret's next version, which becomes current; earlier
    versions are kept. ``metadata``, when given, replaces the stored metadata. The row is
    locked while the version number is taken, so concurrent updates number in turn."""
    now = timezone.now()
    with transaction.atomic():
        found = secret_get(team_id=team.pk, selector=selector)
        # Re-read under the lock: a revoke may have won the race since the lookup.
        secret = Secret.objects.select_for_update().get(pk=found.pk)
        if secret.revoked_at is not None:
            secret_get(team_id=team.pk, selector=secret.secret_id)  # raises the 404
        secret.current_version += 1
        secret.updated_at = now
        fields = ["current_version", "updated_at"]
        if metadata is not None:
            secret.metadata = metadata
            fields.append("metadata")
        secret.save(update_fields=fields)
        SecretVersion.objects.create(
            secret=secret,
            version=secret.current_version,
            value_encrypted=crypto.encrypt(value.encode()),
            created_at=now,
        )
    return secret


def secret_revoke(*, team: Team, selector: str) -> None:
    """Revoke the secret: from the commit on it resolves to nothing (a rule naming it
    sends no such header) and every version's value is erased. The row stays, as the
    record that it existed; its name may be taken by a new secret. A second revoke: 404."""
    now = timezone.now()
    with transaction.atomic():
        found = secret_get(team_id=team.pk, selector=selector)
        updated = Secret.objects.filter(pk=found.pk, revoked_at__isnull=True).update(
            revoked_at=now, updated_at=now
        )
        if not updated:  # revoked by a concurrent request since the lookup
            secret_get(team_id=team.pk, selector=found.secret_id)
        SecretVersion.objects.filter(secret_id=found.pk).update(value_encrypted=b"")
