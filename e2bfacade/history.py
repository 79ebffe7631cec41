"""Changes made through the API, written to the admin site's history (Django's
``LogEntry``) beside the operator's own, so "who changed this key, and when" has one answer.

A ``LogEntry`` needs a user, and API callers are teams, not users: the entries are made by
one service account (:data:`API_USERNAME`, inactive, no usable password — it cannot log in),
and the message names the credential that acted."""

from __future__ import annotations

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.db.models import Model

API_USERNAME = "e2b-api"

__all__ = ["ADDITION", "CHANGE", "DELETION", "API_USERNAME", "record"]


def _api_user_id() -> int:
    user_model = get_user_model()
    # get_or_create is race-safe on the unique username: a concurrent insert's row is read.
    user, created = user_model.objects.get_or_create(
        username=API_USERNAME, defaults={"is_active": False}
    )
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return int(user.pk)


def record(*, obj: Model, action: int, message: str, actor: object) -> None:
    """One history entry for ``obj``: ``message`` and who acted (``str(actor)``)."""
    LogEntry.objects.log_actions(
        user_id=_api_user_id(),
        queryset=[obj],
        action_flag=action,
        change_message=f"{message} (through the API, by {actor})",
        single_object=True,
    )
