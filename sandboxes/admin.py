"""Read-only admin for sandboxes and volumes: find a sandbox by id or metadata, see its state
and times, follow it to its idempotency record; see a volume's size limit, what it uses and
which live sandboxes mount it. State changes only through the services (a row edited here
would disagree with the runtime), so the writes are actions: "kill", which calls
``sandbox_kill`` exactly as ``DELETE /sandboxes/{id}`` does, and a volume's "revoke
tokens"."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Exists, OuterRef, QuerySet, TextField
from django.db.models.functions import Cast
from django.db.models.lookups import IContains
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from e2bfacade.admin import ReadOnlyAdmin
from e2bfacade.errors import ApiError, NotFound
from e2bfacade.runtime.base import SandboxRuntimeError
from idempotency.admin import record_link
from sandboxes import services
from sandboxes.models import Sandbox, Secret, Volume
from sandboxes.volumes import services as volume_services
from templates.models import Template

# The detail page, all read-only. envd_access_token and env_vars' values are the sandbox
# owner's secrets: never shown (env var names are).
FIELDS = (
    "sandbox_id",
    "team",
    "template_ref",
    "alias",
    "state",
    "wire_state",
    "pause_mode",
    "state_reason",
    "host",
    "idempotency_record",
    "state_changed_at",
    "started_at",
    "end_at",
    "killed_at",
    "on_timeout",
    "auto_pause_memory",
    "cpu_count",
    "memory_mb",
    "disk_size_mb",
    "envd_version",
    "metadata",
    "env_var_names",
    "auto_resume",
    "allow_internet_access",
)


@admin.register(Sandbox)
class SandboxAdmin(ReadOnlyAdmin[Sandbox]):
    list_display = [
        "sandbox_id",
        "team",
        "template_ref",
        "state",
        "wire_state",
        "pause_mode",
        "host",
        "started_at",
        "end_at",
    ]
    list_filter = ["state", "pause_mode", "host", "team", "template"]
    # Not the template: it may have been deleted since (killed sandboxes keep naming it, with
    # no database constraint), and a join would hide those rows.
    list_select_related = ["team"]
    # The metadata is searched as text (see get_search_results), so `tag` or a value finds it.
    search_fields = ["sandbox_id"]
    search_help_text = "A sandbox id, or any text of its metadata (keys or values)."
    date_hierarchy = "started_at"
    ordering = ["-started_at"]
    actions = ["kill_selected"]
    fields = FIELDS
    readonly_fields = FIELDS

    def get_queryset(self, request: HttpRequest) -> QuerySet[Sandbox]:
        # In the same query, whether the template still exists: no query per row.
        return (
            super()
            .get_queryset(request)
            .annotate(template_exists=Exists(Template.objects.filter(pk=OuterRef("template_id"))))
        )

    @admin.display(description="template", ordering="template_id")
    def template_ref(self, obj: Sandbox) -> SafeString | str:
        """The template's id, linked while the template exists (it may have been deleted)."""
        if not getattr(obj, "template_exists", True):
            return f"{obj.template_id} (deleted)"
        url = reverse("admin:templates_template_change", args=[obj.template_id])
        return format_html('<a href="{}">{}</a>', url, obj.alias or obj.template_id)

    @admin.display(description="wire state")
    def wire_state(self, obj: Sandbox) -> str:
        return obj.wire_state

    @admin.display(description="idempotency record")
    def idempotency_record(self, obj: Sandbox) -> SafeString | str:
        return record_link(team_id=obj.team_id, resource_id=obj.sandbox_id)

    @admin.display(description="env vars (names only)")
    def env_var_names(self, obj: Sandbox) -> str:
        return ", ".join(sorted(obj.env_vars)) or "—"

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Sandbox], search_term: str
    ) -> tuple[QuerySet[Sandbox], bool]:
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        if search_term:
            # The JSON as text: the same on PostgreSQL (jsonb::text) and SQLite (the stored
            # text), so a key or a value of the metadata finds the sandbox on both.
            results = results | queryset.filter(
                IContains(Cast("metadata", TextField()), search_term)
            )
        return results, may_have_duplicates

    @admin.action(description="Kill selected sandboxes", permissions=["kill"])
    def kill_selected(self, request: HttpRequest, queryset: QuerySet[Sandbox]) -> None:
        # One sandbox at a time through the service, outside any transaction (the admin runs
        # actions without one): each kill claims its row, calls the runtime, records it.
        killed, gone, failed = [], [], []
        for sandbox in queryset.select_related("team").exclude(state=Sandbox.State.KILLED):
            try:
                services.sandbox_kill(team=sandbox.team, sandbox_id=sandbox.sandbox_id)
            except NotFound:
                gone.append(sandbox.sandbox_id)  # killed meanwhile, by someone else
            except ApiError as exc:
                failed.append(f"{sandbox.sandbox_id} ({exc.message})")
            else:
                killed.append(sandbox.sandbox_id)
        if killed:
            self.message_user(request, f"Killed {len(killed)} sandbox(es).", messages.SUCCESS)
        if gone:
            self.message_user(
                request, f"Already killed or being killed: {', '.join(gone)}.", messages.INFO
            )
        if failed:
            self.message_user(
                request,
                f"Not killed (the worker retries): {'; '.join(failed)}.",
                messages.ERROR,
            )
        if not (killed or gone or failed):
            self.message_user(request, "No live sandbox selected.", messages.INFO)

    def has_kill_permission(self, request: HttpRequest) -> bool:
        # Django's own change permission (superusers have it), not has_change_permission
        # (ReadOnlyAdmin), which is off so that no form can edit a row.
        return request.user.has_perm("sandboxes.change_sandbox")


VOLUME_FIELDS = (
    "volume_id",
    "name",
    "team",
    "state",
    "size_mb",
    "used",
    "mounted_by",
    "host",
    "token_epoch",
    "idempotency_record",
    "created_at",
    "state_changed_at",
)


@admin.register(Volume)
class VolumeAdmin(ReadOnlyAdmin[Volume]):
    list_display = ["name", "volume_id", "team", "state", "size_mb", "host", "created_at"]
    list_filter = ["state", "host", "team"]
    list_select_related = ["team"]
    search_fields = ["name", "volume_id"]
    search_help_text = "A volume's name or id."
    ordering = ["-created_at"]
    actions = ["revoke_tokens"]
    fields = VOLUME_FIELDS
    readonly_fields = VOLUME_FIELDS

    @admin.display(description="used")
    def used(self, obj: Volume) -> str:
        """What its file system holds, from the runtime (this host's volumes only)."""
        try:
            info = volume_services.volume_runtime(obj).volume_info(obj.runtime_id)
        except ApiError as exc:
            return f"— ({exc.message})"
        except (SandboxRuntimeError, OSError) as exc:
            return f"— (the runtime cannot say: {exc})"
        return f"{info.used_bytes / (1 << 20):.1f} MB of {info.size_mb} MB"

    @admin.display(description="mounted by (sandboxes not killed)")
    def mounted_by(self, obj: Volume) -> SafeString | str:
        mounts = obj.live_mounts().order_by("sandbox_id").values_list("sandbox_id", "path")[:100]
        if not mounts:
            return "—"
        return format_html_join(
            ", ",
            '<a href="{}">{}</a> at {}',
            (
                (reverse("admin:sandboxes_sandbox_change", args=[sid]), sid, path)
                for sid, path in mounts
            ),
        )

    @admin.display(description="idempotency record")
    def idempotency_record(self, obj: Volume) -> SafeString | str:
        return record_link(team_id=obj.team_id, resource_id=str(obj.volume_id))

    @admin.action(description="Revoke the selected volumes' tokens", permissions=["revoke"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[Volume]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        count = volume_services.volume_revoke_tokens(volume_ids=ids)
        self.message_user(
            request,
            f"Revoked every token of {count} volume(s): GET /volumes/{{id}} mints new ones.",
            messages.SUCCESS,
        )

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sandboxes.change_volume")


@admin.register(Secret)
class SecretAdmin(ReadOnlyAdmin[Secret]):
    """A team's secrets, metadata only: no version and no value (encrypted or not) is on
    any page. Changing a value, or revoking one, is the team's, through the API."""

    list_display = ["name", "secret_id", "team", "current_version", "updated_at", "revoked_at"]
    list_filter = ["revoked_at"]
    list_select_related = ["team"]
    search_fields = ["name", "secret_id", "team__name"]
    fields = [
        "secret_id",
        "name",
        "team",
        "current_version",
        "metadata",
        "created_at",
        "updated_at",
        "revoked_at",
    ]
