"""Read-only admin for idempotency records: find a key, its sandbox, its state and lease.
Stored bodies are shown decrypted with every token redacted."""

from __future__ import annotations

import json
import re
from typing import Any

from django.apps import apps
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from e2bfacade import crypto
from e2bfacade.admin import ReadOnlyAdmin
from idempotency.maintenance import purge_expired
from idempotency.models import IdempotencyRecord
from idempotency.registry import find_operation

SECRET_FIELDS = re.compile(r"token|secret|password|key", re.IGNORECASE)


def redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ("[redacted]" if SECRET_FIELDS.search(k) and v is not None else redact(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def record_link(*, team_id: int, resource_id: str) -> SafeString | str:
    """A link to the idempotency record that reserved ``resource_id`` (the sandbox or
    snapshot admin shows it): its page when there is one record, else the filtered list."""
    pks = list(
        IdempotencyRecord.objects.filter(team_id=team_id, resource_id=resource_id).values_list(
            "pk", flat=True
        )[:2]
    )
    if not pks:
        return "— (made without an Idempotency-Key)"
    if len(pks) == 1:
        url = reverse("admin:idempotency_idempotencyrecord_change", args=[pks[0]])
    else:
        changelist = reverse("admin:idempotency_idempotencyrecord_changelist")
        url = f"{changelist}?{urlencode({'resource_id': resource_id})}"
    return format_html('<a href="{}" id="idempotency-record-link">idempotency record</a>', url)


class ExpiredFilter(admin.SimpleListFilter):
    title = "retention"
    parameter_name = "expired"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "expired"), ("no", "live")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        now = timezone.now()
        if self.value() == "yes":
            return queryset.filter(expires_at__lte=now)
        if self.value() == "no":
            return queryset.filter(expires_at__gt=now)
        return queryset


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin[IdempotencyRecord]):
    list_display = [
        "key",
        "route",
        "team",
        "state",
        "resource_id",
        "attempt",
        "lease_owner",
        "lease_expires_at",
        "response_status",
        "created_at",
        "expired",
    ]
    list_select_related = ["team"]
    list_filter = ["state", "route", "team", ExpiredFilter, "expires_at"]
    search_fields = ["key", "resource_id"]
    date_hierarchy = "created_at"
    actions = ["purge_expired_records"]
    fields = (
        "team",
        "key",
        "route",
        "fingerprint",
        "state",
        "resource_id",
        "attempt",
        "lease_owner",
        "lease_expires_at",
        "created_at",
        "completed_at",
        "expires_at",
        "retention",
        "resource",
        "response_status",
        "response_content_type",
        "stored_request",
        "stored_response",
    )
    readonly_fields = fields

    @admin.display(boolean=True, description="expired")
    def expired(self, obj: IdempotencyRecord) -> bool:
        return obj.expires_at <= timezone.now()

    @admin.display(description="retention")
    def retention(self, obj: IdempotencyRecord) -> SafeString:
        if obj.expires_at <= timezone.now():
            return format_html(
                '<strong class="expired" style="color:#ba2121">EXPIRED</strong> since {} — the '
                "key may be used for a new request; the record is purgeable",
                f"{obj.expires_at:%Y-%m-%d %H:%M:%S} UTC",
            )
        return format_html(
            '<span class="live">live</span> until {}', f"{obj.expires_at:%Y-%m-%d %H:%M:%S} UTC"
        )

    @admin.display(description="resource")
    def resource(self, obj: IdempotencyRecord) -> SafeString | str:
        """The resource this key reserved (a sandbox, a snapshot), linked when it exists.
        Which model that is, the record's registered operation says (``resource_model``)."""
        op = find_operation(obj.route)
        if op is None or op.resource_model is None:
            return obj.resource_id
        model = apps.get_model(op.resource_model)
        if not model._default_manager.filter(pk=obj.resource_id).exists():
            return obj.resource_id
        opts = model._meta
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.resource_id])
        return format_html('<a href="{}">{}</a>', url, obj.resource_id)

    def _decrypted(self, blob: bytes | memoryview | None) -> str:
        if blob is None:
            return "—"
        try:
            raw = crypto.decrypt(blob)
        except ImproperlyConfigured as exc:
            # One record encrypted under a key since removed must not break its page.
            return f"<cannot be decrypted: {exc}>"
        try:
            return json.dumps(redact(json.loads(raw)), indent=2)
        except ValueError:
            return f"<{len(raw)} bytes, not JSON>"

    @admin.display(description="request (redacted)")
    def stored_request(self, obj: IdempotencyRecord) -> str:
        return format_html("<pre>{}</pre>", self._decrypted(obj.request_encrypted))

    @admin.display(description="response body (redacted)")
    def stored_response(self, obj: IdempotencyRecord) -> str:
        return format_html("<pre>{}</pre>", self._decrypted(obj.response_body_encrypted))

    @admin.action(description="Purge every expired record (not only the selected)")
    def purge_expired_records(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        n = purge_expired()
        self.message_user(request, f"purged {n} expired idempotency records")
