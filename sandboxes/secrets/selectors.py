"""Secret reads: the API's (metadata only) and the egress proxy's (the current value)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q, QuerySet

from e2bfacade import crypto
from e2bfacade.errors import BadRequest, NotFound
from e2bfacade.paging import make_token, read_token
from e2bfacade.runtime.local.net.transform import SECRET_KIND, placeholders
from sandboxes.identity import tokens
from sandboxes.models import Sandbox, Secret, SecretVersion

logger = logging.getLogger(__name__)
TOKEN_SALT = "e2bfacade.secret-list"
IDENTITY_KIND = "identity.tokens"
EGRESS_PROXY_KIND = "egressProxy"  # the egress proxy asks for its SOCKS password so
ID_PREFIX = "sec_"


def live_secrets(*, team_id: int) -> QuerySet[Secret]:
    return Secret.objects.filter(team_id=team_id, revoked_at__isnull=True)


def secret_get(*, team_id: int, selector: str) -> Secret:
    """The team's live secret named by ``selector``: its id (``sec_…``) or its name, in
    any case (names are stored lower-case). Another team's, a revoked one, or none: 404
    naming the selector as given (an id or a name, never a value)."""
    rows = live_secrets(team_id=team_id)
    if selector.startswith(ID_PREFIX):
        secret = rows.filter(secret_id=selector).first()
    else:
        secret = rows.filter(name=selector.lower()).first()
    if secret is None:
        raise NotFound(f"secret '{selector}' not found")
    return secret


def secret_list(
    *, team_id: int, limit: int, next_token: str | None
) -> tuple[list[Secret], str | None]:
    """Oldest first; keyset paging on (createdAt, secretID) with signed tokens."""
    qs = live_secrets(team_id=team_id)
    if next_token:
        at, last = read_token(next_token, salt=TOKEN_SALT, filters=[team_id])
        qs = qs.filter(Q(created_at__gt=at) | Q(created_at=at, secret_id__gt=last))
    rows = list(qs.order_by("created_at", "secret_id")[: limit + 1])
    token = None
    if len(rows) > limit:
        rows = rows[:limit]
        token = make_token(
            salt=TOKEN_SALT, at=rows[-1].created_at, pk=rows[-1].secret_id, filters=[team_id]
        )
    return rows, token


def secret_value(*, team_id: int, name: str) -> str | None:
    """The current value of the team's live secret ``name`` (canonical or not), or None:
    no such secret, revoked, or unreadable (its key was dropped without a rotation —
    logged by name, never by value). Read on every use, so a new version or a revoke
    applies to the next request that resolves it. One query."""
    version = (
        SecretVersion.objects.filter(
            secret__team_id=team_id,
            secret__name=name.lower(),
            secret__revoked_at__isnull=True,
        )
        .order_by("-version")
        .values_list("value_encrypted", flat=True)
        .first()
    )
    if not version:
        return None
    try:
        return crypto.decrypt(version).decode()
    except ImproperlyConfigured:
        logger.error(
            "secret %r of team %s cannot be decrypted with the configured keys", name, team_id
        )
        return None


def secrets_missing(*, team_id: int, names: set[str]) -> list[str]:
    """Which of ``names`` the team has no live secret of, sorted (one query)."""
    canonical = {n.lower(): n for n in names}
    found = set(
        live_secrets(team_id=team_id)
        .filter(name__in=list(canonical))
        .values_list("name", flat=True)
    )
    return sorted(original for lower, original in canonical.items() if lower not in found)


def check_rule_placeholders(
    *,
    team_id: int,
    rules: dict[str, Any] | None,
    tokens: Collection[str] = (),
) -> None:
    """Refuse (400, naming them) network ``rules`` whose headers name secrets the team has
    no live secret of, or workload tokens the sandbox's ``iam`` does not declare
    (``tokens``). A secret revoked later is the proxy's to handle: its header is dropped."""
    names: set[str] = set()
    for domain_rules in (rules or {}).values():
        for rule in domain_rules:
            for value in ((rule.get("transform") or {}).get("headers") or {}).values():
                for kind, name in placeholders(value):
                    if kind != SECRET_KIND:
                        if name not in tokens:
                            raise BadRequest(
                                f"network rules name a workload token the sandbox's iam does "
                                f"not declare: {name}"
                            )
                        continue
                    names.add(name)
    missing = secrets_missing(team_id=team_id, names=names)
    if missing:
        raise BadRequest(f"network rules name unknown secrets: {', '.join(missing)}")


def placeholder_value(sandbox_id: str, kind: str, name: str) -> str | None:
    """What the egress proxy writes for a placeholder in a request of ``sandbox_id``: the
    current value of its team's live secret ``name``; None for anything else (an unknown
    or revoked secret, an identity token, a sandbox that is gone). Two queries, no cache:
    a new version or a revoke applies to the very next request."""
    if kind == EGRESS_PROXY_KIND and name == "password":
        blob = (
            Sandbox.objects.filter(pk=sandbox_id)
            .exclude(state=Sandbox.State.KILLED)
            .values_list("egress_proxy_password", flat=True)
            .first()
        )
        return crypto.decrypt(blob).decode() if blob else None
    if kind == IDENTITY_KIND:
        row = (
            Sandbox.objects.filter(pk=sandbox_id)
            .exclude(state=Sandbox.State.KILLED)
            .values("team_id", "iam")
            .first()
        )
        if row is None:
            return None
        iam: dict[str, Any] = row["iam"] or {}
        token = (iam.get("tokens") or {}).get(name)
        if token is None:
            return None
        return tokens.mint(
            issuer=iam["issuer"],
            team_id=row["team_id"],
            sandbox_id=sandbox_id,
            audience=token["audience"],
        )
    if kind != SECRET_KIND:
        return None
    team_id = (
        Sandbox.objects.filter(pk=sandbox_id)
        .exclude(state=Sandbox.State.KILLED)
        .values_list("team_id", flat=True)
        .first()
    )
    if team_id is None:
        return None
    return secret_value(team_id=team_id, name=name)
