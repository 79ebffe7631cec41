"""A team's API keys and access tokens through E2B's routes: list, create, rename, delete.

Every change is written to the admin site's history (e2bfacade.history). Deleting a key
revokes it (the row stays, for the history and the admin's list); deleting an access token
removes its row. The last live key of a team cannot be deleted through the API: a team
without a key can start nothing, and getting one back takes the operator (``create_team``).
The operator may still revoke it deliberately on the admin site.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from e2bfacade import history
from e2bfacade.auth import forget_api_keys
from e2bfacade.errors import BadRequest, NotFound
from e2bfacade.failpoints import failpoint
from e2bfacade.models import AccessToken, ApiKey, Team, access_token_mint, api_key_create

NAME_MAX = 255


def check_name(value: object, *, what: str) -> str:
    """A key's or token's ``name``: a non-empty string of at most NAME_MAX characters."""
    if not isinstance(value, str):
        raise BadRequest(f"{what} name must be a string")
    name = value.strip()
    if not name:
        raise BadRequest(f"{what} name must not be empty")
    if len(name) > NAME_MAX:
        raise BadRequest(f"{what} name must be at most {NAME_MAX} characters")
    return name


def _uuid(value: str, *, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadRequest(f"invalid {what} ID '{value}'") from None


def api_key_list(*, team: Team) -> QuerySet[ApiKey]:
    """The team's live keys, oldest first."""
    return ApiKey.objects.filter(team=team, revoked_at__isnull=True).order_by("created_at", "pk")


def api_key_make(*, team: Team, name: object, actor: object) -> tuple[ApiKey, str]:
    """A new key (the raw value is returned once, never stored). Not idempotent: a repeat
    makes another key."""
    key, raw = api_key_create(team=team, name=check_name(name, what="API key"))
    history.record(obj=key, action=history.ADDITION, message="Created", actor=actor)
    return key, raw


def _live_key(team: Team, key_id: str) -> QuerySet[ApiKey]:
    # Another team's key is a 404 like an unknown one: nothing says it exists.
    return api_key_list(team=team).filter(public_id=_uuid(key_id, what="API key"))


def api_key_rename(*, team: Team, key_id: str, name: object, actor: object) -> ApiKey:
    new_name = check_name(name, what="API key")
    key = _live_key(team, key_id).first()
    if key is None:
        raise NotFound(f"API key '{key_id}' not found")
    old_name = key.name
    key.name = new_name
    key.save(update_fields=["name"])
    history.record(
        obj=key, action=history.CHANGE, message=f"Renamed from {old_name!r}", actor=actor
    )
    return key


def api_key_delete(*, team: Team, key_id: str, actor: object) -> None:
    """Revoke the key; 404 when it is unknown, another team's or already deleted; 400 when
    it is the team's last live key. Concurrent deletes of a team's last two keys: the team
    row's lock orders them, so the second sees one key left and is refused."""
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        key = _live_key(team, key_id).first()
        if key is None:
            raise NotFound(f"API key '{key_id}' not found")
        if not api_key_list(team=team).exclude(pk=key.pk).exists():
            raise BadRequest(
                "cannot delete the team's last API key: create another first "
                "(the operator can still revoke it on the admin site)"
            )
        failpoint("api_key_delete.checked")  # the race's window, widened by a test
        ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
        history.record(obj=key, action=history.DELETION, message="Revoked", actor=actor)
    forget_api_keys()  # at once in this process; in the others within API_KEY_CACHE_SECONDS


def access_token_make(*, team: Team, name: object, actor: object) -> tuple[AccessToken, str]:
    token, raw = access_token_mint(team=team, name=check_name(name, what="access token"))
    history.record(obj=token, action=history.ADDITION, message="Created", actor=actor)
    return token, raw


def access_token_delete(*, team: Team, token_id: str, actor: object) -> None:
    """Delete the token (a token may delete itself); 404 when unknown or another team's."""
    pk = _uuid(token_id, what="access token")
    with transaction.atomic():
        token = AccessToken.objects.select_for_update().filter(team=team, pk=pk).first()
        if token is None:
            raise NotFound(f"access token '{token_id}' not found")
        history.record(obj=token, action=history.DELETION, message="Deleted", actor=actor)
        token.delete()
