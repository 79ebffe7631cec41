"""E2B wire shapes for sandboxes: names exactly as on the wire (camelCase, and the one
snake_case field ``allow_internet_access``)."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from e2bfacade import capabilities
from e2bfacade.fields import (
    NullMeansAbsent,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StringMapField,
)
from e2bfacade.runtime.base import Capability
from e2bfacade.schema import NULLABLE_STRING
from sandboxes.models import CLIENT_ID, Sandbox
from sandboxes.services import CreateRequest

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_REFRESH_SECONDS = 3600


class AutoResumeSerializer(NullMeansAbsent):
    enabled = StrictBooleanField(required=False, default=False)


class NewSandboxSerializer(NullMeansAbsent):
    """``POST /v2/sandboxes`` (and v1 with another default timeout). Unknown fields are
    ignored, as E2B does. Fields this server cannot honour are refused by name: accepting
    them would be a silent lie about what the sandbox does."""

    templateID = StrictCharField(max_length=128)
    timeout = StrictIntegerField(required=False, min_value=1, default=300)
    autoPause = StrictBooleanField(required=False, default=False)
    autoPauseMemory = StrictBooleanField(required=False, default=True)
    autoResume = AutoResumeSerializer(required=False, allow_null=True)
    secure = StrictBooleanField(required=False, allow_null=True)  # accepted, no effect
    allow_internet_access = StrictBooleanField(required=False, allow_null=True)
    network = serializers.JSONField(required=False, allow_null=True)
    metadata = StringMapField(
        required=False, allow_null=True, max_entries=100, max_key=256, max_value=2048
    )
    envVars = StringMapField(
        required=False, allow_null=True, max_entries=200, max_key=256, max_value=32768
    )
    mcp = serializers.JSONField(required=False, allow_null=True)
    iam = serializers.JSONField(required=False, allow_null=True)
    volumeMounts = serializers.JSONField(required=False, allow_null=True)

    def validate_envVars(self, value: dict[str, str] | None) -> dict[str, str] | None:
        for name in value or {}:
            if not ENV_NAME.fullmatch(name):
                raise serializers.ValidationError(
                    f"{name!r} is not a valid environment variable name"
                )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # What the driver cannot do, from its declared capabilities. (A driver that gains
        # NETWORK_RULES or VOLUME_MOUNTS must also get them carried into its SandboxSpec.)
        errors = capabilities.refusals(
            {
                "allow_internet_access": (
                    attrs.get("allow_internet_access") is True,
                    Capability.INTERNET_ACCESS,
                ),
                "network": (bool(attrs.get("network")), Capability.NETWORK_RULES),
                "volumeMounts": (bool(attrs.get("volumeMounts")), Capability.VOLUME_MOUNTS),
                "autoPauseMemory": (
                    attrs.get("autoPauseMemory") is False,
                    Capability.FILESYSTEM_PAUSE,
                ),
            }
        )
        # What this service itself does not do, whatever the driver.
        service_refusals = {
            "mcp": (bool(attrs.get("mcp")), "MCP gateways are not supported by this server"),
            "iam": (bool(attrs.get("iam")), "workload identity is not supported by this server"),
        }
        errors |= {name: [why] for name, (bad, why) in service_refusals.items() if bad}
        if errors:
            raise serializers.ValidationError(errors)
        return attrs

    def canonical(self) -> dict[str, Any]:
        """The body as idempotency fingerprints and stores it: validated, scalar defaults
        applied, nulls and unknown fields dropped; an absent object stays absent."""
        data: dict[str, Any] = _json_safe(dict(self.validated_data))
        return data


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items() if v is not None}
    return value


def create_request_from(body: dict[str, Any]) -> CreateRequest:
    """A CreateRequest from a canonical create body (see NewSandboxSerializer.canonical)."""
    return CreateRequest(
        template_ref=body["templateID"],
        timeout=body["timeout"],
        auto_pause=body["autoPause"],
        auto_resume=bool((body.get("autoResume") or {}).get("enabled")),
        metadata=body.get("metadata") or {},
        env_vars=body.get("envVars") or {},
    )


class NewSandboxV1Serializer(NewSandboxSerializer):
    timeout = StrictIntegerField(required=False, min_value=1, default=15)


class TimeoutBodySerializer(NullMeansAbsent):
    timeout = StrictIntegerField(min_value=1)


class ConnectSerializer(NullMeansAbsent):
    default_timeout = 300

    timeout = StrictIntegerField(required=False, min_value=1)
    memory = StrictBooleanField(required=False, allow_null=True)

    def validate_memory(self, value: bool | None) -> bool | None:
        message = capabilities.refusal(Capability.REBOOT_ON_RESUME)
        if value is False and message:
            raise serializers.ValidationError(message)
        return value

    def timeout_or_default(self) -> int:
        return self.validated_data.get("timeout") or self.default_timeout


class ResumeSerializer(ConnectSerializer):
    default_timeout = 15


class PauseSerializer(NullMeansAbsent):
    memory = StrictBooleanField(required=False, allow_null=True)
    requireHealthyGuest = StrictBooleanField(required=False, allow_null=True)

    def validate_memory(self, value: bool | None) -> bool | None:
        message = capabilities.refusal(Capability.FILESYSTEM_PAUSE)
        if value is False and message:
            raise serializers.ValidationError(message)
        return value


class RefreshSerializer(NullMeansAbsent):
    duration = StrictIntegerField(required=False, min_value=0, max_value=MAX_REFRESH_SECONDS)

    def duration_or_default(self) -> int:
        # E2B: absent or under 15 s means 15 s.
        return max(self.validated_data.get("duration") or 0, 15)


class MetricsQuerySerializer(NullMeansAbsent):
    start = serializers.IntegerField(required=False, min_value=0)
    end = serializers.IntegerField(required=False, min_value=0)


# ------------------------------------------------------------------------------ output
class SandboxSerializer(serializers.Serializer[Sandbox]):
    """``Sandbox``: the answer to create, connect and resume."""

    templateID = serializers.CharField(source="template_id")
    sandboxID = serializers.CharField(source="sandbox_id")
    clientID = serializers.SerializerMethodField()
    envdVersion = serializers.CharField(source="envd_version")
    alias = serializers.CharField()
    envdAccessToken = serializers.CharField(source="envd_access_token")
    trafficAccessToken = serializers.SerializerMethodField()
    domain = serializers.SerializerMethodField()

    def get_clientID(self, obj: Sandbox) -> str:
        return CLIENT_ID

    @extend_schema_field(NULLABLE_STRING)
    def get_trafficAccessToken(self, obj: Sandbox) -> None:
        return None

    @extend_schema_field(serializers.CharField(help_text="SANDBOX_DOMAIN; never null"))
    def get_domain(self, obj: Sandbox) -> str:
        # Never null: without a domain (and E2B_DOMAIN, E2B_SANDBOX_URL) the SDKs send the
        # sandbox's data-plane traffic, its access token included, to e2b.app.
        return str(settings.SANDBOX_DOMAIN)


class ListedSandboxSerializer(serializers.Serializer[Sandbox]):
    templateID = serializers.CharField(source="template_id")
    sandboxID = serializers.CharField(source="sandbox_id")
    clientID = serializers.SerializerMethodField()
    alias = serializers.CharField()
    startedAt = serializers.DateTimeField(source="started_at")
    endAt = serializers.DateTimeField(source="end_at")
    cpuCount = serializers.IntegerField(source="cpu_count")
    memoryMB = serializers.IntegerField(source="memory_mb")
    diskSizeMB = serializers.IntegerField(source="disk_size_mb")
    state = serializers.CharField(source="wire_state")
    envdVersion = serializers.CharField(source="envd_version")
    metadata = serializers.DictField(child=serializers.CharField())

    def get_clientID(self, obj: Sandbox) -> str:
        return CLIENT_ID


class LifecycleSerializer(serializers.Serializer[Sandbox]):
    autoResume = serializers.BooleanField(source="auto_resume")
    onTimeout = serializers.CharField(source="on_timeout")


class SandboxDetailSerializer(ListedSandboxSerializer):
    envdAccessToken = serializers.CharField(source="envd_access_token")
    domain = serializers.SerializerMethodField()
    allowInternetAccess = serializers.BooleanField(source="allow_internet_access")
    lifecycle = LifecycleSerializer(source="*")
    pauseMode = serializers.SerializerMethodField()

    @extend_schema_field(serializers.CharField(help_text="SANDBOX_DOMAIN; never null"))
    def get_domain(self, obj: Sandbox) -> str:
        # as SandboxSerializer.get_domain: never null
        return str(settings.SANDBOX_DOMAIN)

    def get_pauseMode(self, obj: Sandbox) -> str:
        return "full"  # a pause is a freeze: memory is kept


class MetricSerializer(serializers.Serializer[dict[str, Any]]):
    timestamp = serializers.DateTimeField()
    timestampUnix = serializers.IntegerField()
    cpuCount = serializers.IntegerField()
    cpuUsedPct = serializers.FloatField()
    memUsed = serializers.IntegerField()
    memTotal = serializers.IntegerField()
    memCache = serializers.IntegerField()
    diskUsed = serializers.IntegerField()
    diskTotal = serializers.IntegerField()
