"""Admin for teams, API keys and access tokens. A key's or token's hash is never displayed;
the raw value is shown once. What E2B's admin routes do is here too: a team's running
sandboxes are counted on the team list; its sandboxes are killed from the sandbox list
(filter by team, "Kill selected sandboxes") and its builds cancelled from the build list."""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin, messages
from django.db.models import Count, Model, Q, QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils import timezone

from e2bfacade.auth import forget_api_keys
from e2bfacade.models import AccessToken, ApiKey, Team, api_key_create

_M = TypeVar("_M", bound=Model)


class ReadOnlyAdmin(admin.ModelAdmin[_M]):
    """The operator's pages of rows the service owns: no form adds, changes or deletes one
    (what an operator may do to them are actions, through the service's own writes)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin[Team]):
    list_display = ["name", "team_id", "key_count", "running_count", "created_at"]
    search_fields = ["name"]
    readonly_fields = ["created_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        # One query for the whole changelist instead of COUNTs per row. The sandboxes are
        # named by their relation's name: this app may not import the sandboxes app.
        return (
            super()
            .get_queryset(request)
            .annotate(
                key_count=Count(
                    "api_keys", filter=Q(api_keys__revoked_at__isnull=True), distinct=True
                ),
                running_count=Count(
                    "sandboxes", filter=Q(sandboxes__state="running"), distinct=True
                ),
            )
        )

    @admin.display(description="teamID", ordering="pk")
    def team_id(self, team: Team) -> int:
        return int(team.pk)

    @admin.display(description="live API keys", ordering="key_count")
    def key_count(self, team: Team) -> int:
        return int(getattr(team, "key_count", 0))

    @admin.display(description="running sandboxes", ordering="running_count")
    def running_count(self, team: Team) -> int:
        return int(getattr(team, "running_count", 0))


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    list_display = ["prefix", "name", "team", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    list_select_related = ["team"]
    search_fields = ["prefix", "name", "team__name"]
    # key_hash is in neither list: it is useless to a human and only helps an attacker.
    fields = ["team", "name", "public_id", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["public_id", "prefix", "created_at", "last_used_at"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        # A key cannot move to another team after creation: its holder would silently gain
        # access to that team's sandboxes.
        return [*self.readonly_fields, "team"] if obj is not None else list(self.readonly_fields)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # The system team has no keys (api_key_create refuses): it is not offered.
        if db_field.name == "team":
            kwargs["queryset"] = Team.objects.filter(system=False)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(
        self, request: HttpRequest, obj: ApiKey, form: ModelForm[ApiKey], change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # New keys go through the one service that makes them; the admin then works on the
        # stored row. The raw key exists only in this response.
        key, raw = api_key_create(team=obj.team, name=obj.name)
        obj.pk = key.pk
        obj.refresh_from_db()
        self.message_user(
            request,
            f"New API key for team {obj.team}: {raw} — copy it now, it is stored hashed and "
            "will not be shown again.",
            messages.WARNING,
        )

    @admin.action(description="Revoke selected API keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        forget_api_keys()  # at once here; other processes within API_KEY_CACHE_SECONDS
        self.message_user(request, f"Revoked {revoked} API key(s).", messages.SUCCESS)


@admin.register(AccessToken)
class AccessTokenAdmin(admin.ModelAdmin[AccessToken]):
    """Tokens are made with ``manage.py create_access_token`` or ``POST /access-tokens``
    (the raw token is shown there once); here they are listed and deleted."""

    list_display = ["__str__", "name", "team", "created_at"]
    list_select_related = ["team"]
    search_fields = ["name", "team__name"]
    fields = ["id", "team", "name", "created_at"]
    readonly_fields = ["id", "team", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
