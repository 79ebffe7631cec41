"""Admin for templates (every kind: templates, snapshots, hidden fork images). Resource
limits and the alias can be edited; the image, owner and kind cannot: they tie the row to
the runtime. Templates are added with ``manage.py import_template`` and deleted through the
API (``DELETE /templates/{id}``), which checks that no sandbox uses them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.defaultfilters import filesizeformat

from templates.models import Template


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
