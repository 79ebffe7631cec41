"""Admin for templates (every kind: templates, snapshots, hidden fork images). Resource
limits and the alias can be edited; the image, owner and kind cannot: they tie the row to
the runtime. Templates are added with ``manage.py import_template`` and deleted through the
API (``DELETE /templates/{id}``), which checks that no sandbox uses them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.defaultfilters import filesizeformat

from e2bfacade.admin import ReadOnlyAdmin
from templates.builds.services import CANCELED_BY_OPERATOR, finish_error
from templates.models import BuildStatus, Template, TemplateBuild


@admin.register(Template)
class TemplateAdmin(admin.ModelAdmin[Template]):
    list_display = ["template_id", "alias", "kind", "owner", "image_id", "size", "created_at"]
    list_filter = ["kind", "team"]
    list_select_related = ["team"]
    search_fields = ["template_id", "alias"]
    ordering = ["-created_at"]
    fields = [
        "template_id",
        "alias",
        "kind",
        "team",
        "image_id",
        "size",
        "cpu_count",
        "memory_mb",
        "disk_size_mb",
        "pids_max",
        "warm_pool",
        "envd_version",
        "source_sandbox_id",
        "created_at",
        "updated_at",
    ]
    readonly_fields = [
        "template_id",
        "kind",
        "team",
        "image_id",
        "size",
        "envd_version",
        "source_sandbox_id",
        "created_at",
        "updated_at",
    ]

    @admin.display(description="team", ordering="team__name")
    def owner(self, obj: Template) -> str:
        return str(obj.team) if obj.team_id is not None else "(public)"

    @admin.display(description="size", ordering="size_bytes")
    def size(self, obj: Template) -> str:
        return filesizeformat(obj.size_bytes)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(TemplateBuild)
class TemplateBuildAdmin(ReadOnlyAdmin[TemplateBuild]):
    """Builds, read-only; "cancel" ends a waiting or building one as E2B's
    ``/admin/teams/{teamID}/builds/cancel`` does (filter by team to cancel a team's)."""

    list_display = ["build_id", "template", "team", "status", "created_at", "finished_at"]
    list_filter = ["status", "team"]
    list_select_related = ["template", "team"]
    actions = ["cancel_selected"]

    @admin.action(description="Cancel selected builds", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[TemplateBuild]) -> None:
        live = queryset.filter(status__in=(BuildStatus.WAITING, BuildStatus.BUILDING))
        cancelled = sum(finish_error(b, CANCELED_BY_OPERATOR, step=None) for b in live)
        self.message_user(request, f"Cancelled {cancelled} build(s).", messages.SUCCESS)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("templates.change_templatebuild")
