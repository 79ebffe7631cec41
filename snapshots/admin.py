"""Read-only admin for snapshots (Template rows of kind ``snapshot``): which sandbox each was
taken from, and the idempotency record of a keyed snapshot request."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from e2bfacade.admin import ReadOnlyAdmin
from idempotency.admin import record_link
from sandboxes.models import Sandbox
from snapshots.models import Snapshot

# The detail page, all read-only.
FIELDS = (
    "template_id",
    "alias",
    "team",
    "source_sandbox",
    "idempotency_record",
    "image_id",
    "size",
    "cpu_count",
    "memory_mb",
    "disk_size_mb",
    "created_at",
)


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdmin[Snapshot]):
    list_display = ["template_id", "alias", "owner", "source_sandbox_id", "size", "created_at"]
    list_filter = ["team"]
    list_select_related = ["team"]
    search_fields = ["template_id", "alias", "source_sandbox_id"]
    ordering = ["-created_at"]
    fields = FIELDS
    readonly_fields = FIELDS

    def get_queryset(self, request: HttpRequest) -> QuerySet[Snapshot]:
        return super().get_queryset(request).filter(kind=Snapshot.Kind.SNAPSHOT)

    @admin.display(description="team", ordering="team__name")
    def owner(self, obj: Snapshot) -> str:
        return str(obj.team) if obj.team_id is not None else "(public)"

    @admin.display(description="size", ordering="size_bytes")
    def size(self, obj: Snapshot) -> str:
        return filesizeformat(obj.size_bytes)

    @admin.display(description="source sandbox")
    def source_sandbox(self, obj: Snapshot) -> SafeString | str:
        sandbox_id = obj.source_sandbox_id
        if not sandbox_id:
            return "—"
        if not Sandbox.objects.filter(pk=sandbox_id).exists():
            return sandbox_id
        url = reverse("admin:sandboxes_sandbox_change", args=[sandbox_id])
        return format_html('<a href="{}">{}</a>', url, sandbox_id)

    @admin.display(description="idempotency record")
    def idempotency_record(self, obj: Snapshot) -> SafeString | str:
        if obj.team_id is None:
            return "—"
        return record_link(team_id=obj.team_id, resource_id=obj.template_id)
