"""E2B wire shapes for sandboxes: names exactly as on the wire (camelCase, and the one
snake_case field ``allow_internet_access``)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
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
from e2bfacade.runtime.volumes import MAX_MOUNTS_PER_SANDBOX
from e2bfacade.schema import NULLABLE_STRING
from sandboxes.models import CLIENT_ID, Sandbox
from sandboxes.services import CreateRequest
from sandboxes.volumes.selectors import sandbox_volume_mounts
from sandboxes.volumes.serializers import VolumeMountSerializer

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_REFRESH_SECONDS = 3600


class AutoResumeSerializer(NullMeansAbsent):
    enabled = StrictBooleanField(required=False, default=False)


ALL_TRAFFIC = "0.0.0.0/0"
DOMAIN = re.compile(
    r"(\*\.)?([a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?|\*"
)
MAX_RULES = 1000


def _cidr(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None


class StringListField(serializers.ListField):
    def __init__(self, *, max_items: int, **kwargs: Any) -> None:
        super().__init__(child=StrictCharField(max_length=253), max_length=max_items, **kwargs)


HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token
# Written by the proxy itself, or framing the request: a rule may not set them.
RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"}
)
MAX_RULE_DOMAINS = 100
MAX_RULE_HEADERS = 50


class NetworkRulesField(serializers.Field):  # type: ignore[type-arg]
    """E2B's ``rules``: ``{domain: [{"transform": {"headers": {name: value}}}]}``. A domain
    is a name or a pattern as in ``allowOut``; header names are HTTP tokens (not the ones
    that frame a request); values are printable, and may hold ``${e2b.secrets.<name>}``
    placeholders (checked against the team's secrets by the service)."""

    def to_internal_value(self, data: Any) -> dict[str, list[dict[str, Any]]]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object of domain: [rule]")
        if len(data) > MAX_RULE_DOMAINS:
            raise serializers.ValidationError(f"at most {MAX_RULE_DOMAINS} domains")
        out: dict[str, list[dict[str, Any]]] = {}
        for domain, rules in data.items():
            if not DOMAIN.fullmatch(domain.lower().rstrip(".")):
                raise serializers.ValidationError(f"invalid rule domain {domain}")
            if not isinstance(rules, list):
                raise serializers.ValidationError(f"rules of {domain} must be a list")
            out[domain] = [self._rule(domain, rule) for rule in rules]
        return out

    def _rule(self, domain: str, rule: Any) -> dict[str, Any]:
        transform = rule.get("transform") if isinstance(rule, dict) else None
        if transform is None:
            return {}
        headers = transform.get("headers") if isinstance(transform, dict) else None
        if headers is None:
            return {"transform": {}}
        if not isinstance(headers, dict) or len(headers) > MAX_RULE_HEADERS:
            raise serializers.ValidationError(
                f"transform.headers of {domain} must be an object of at most "
                f"{MAX_RULE_HEADERS} string values"
            )
        for name, value in headers.items():
            if not HEADER_NAME.fullmatch(name) or name.lower() in RESERVED_HEADERS:
                raise serializers.ValidationError(f"header {name!r} of {domain} cannot be set")
            if not isinstance(value, str) or len(value) > 8192:
                raise serializers.ValidationError(
                    f"header {name} of {domain} must be a string of at most 8192 characters"
                )
            if any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value):
                raise serializers.ValidationError(
                    f"header {name} of {domain} must not contain control characters"
                )
        return {"transform": {"headers": dict(headers)}}

    def to_representation(self, value: Any) -> Any:
        return value


IAM_TOKEN_NAME = re.compile(r"[^{}\x00-\x1f\x7f-\x9f]{1,128}")  # as the SDKs check it


class IamField(serializers.Field):  # type: ignore[type-arg]
    """E2B's ``iam``: ``{"tokens": {name: {"audience": str, "tokenType": "JWT-SVID"}}}``.
    Names are what ``${e2b.identity.tokens.<name>}`` names (no brace, no control
    character); at most 20 tokens."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(tokens or {}, dict):
            raise serializers.ValidationError("must be {tokens: {name: {audience, tokenType}}}")
        if len(tokens or {}) > 20:
            raise serializers.ValidationError("at most 20 tokens")
        out = {}
        for name, token in (tokens or {}).items():
            if not IAM_TOKEN_NAME.fullmatch(name):
                raise serializers.ValidationError(f"iam token name {name!r} is not usable")
            audience = token.get("audience") if isinstance(token, dict) else None
            kind = token.get("tokenType") if isinstance(token, dict) else None
            if not isinstance(audience, str) or not 0 < len(audience) <= 1024:
                raise serializers.ValidationError(
                    f"iam token {name}: audience must be a string of 1-1024 characters"
                )
            if kind != "JWT-SVID":
                raise serializers.ValidationError(f"iam token {name}: tokenType must be JWT-SVID")
            out[name] = {"audience": audience, "tokenType": kind}
        return {"tokens": out} if out else {}

    def to_representation(self, value: Any) -> Any:
        return value


class EgressProxySerializer(NullMeansAbsent):
    """E2B's ``SandboxEgressProxyConfig``: a SOCKS5 server, with RFC 1929 credentials."""

    address = StrictCharField(max_length=261, trim_whitespace=False)
    username = StrictCharField(required=False, max_length=255, trim_whitespace=False)
    password = StrictCharField(
        required=False, allow_blank=True, max_length=255, trim_whitespace=False
    )

    def validate_address(self, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise serializers.ValidationError("must be host:port (e.g. proxy.example.com:1080)")
        if _cidr(host) is None and not DOMAIN.fullmatch(host.lower()) or "*" in host:
            raise serializers.ValidationError(f"invalid proxy host {host}")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for name in ("username", "password"):
            if len(attrs.get(name, "").encode()) > 255:
                raise serializers.ValidationError({name: ["at most 255 bytes (RFC 1929)"]})
        if "password" in attrs and "username" not in attrs:
            raise serializers.ValidationError({"password": ["needs a username (RFC 1929)"]})
        return attrs


class EgressSerializer(NullMeansAbsent):
    """``allowOut`` / ``denyOut`` / ``dnsServers``, as E2B validates them (create's
    ``network`` and the body of ``PUT /sandboxes/{id}/network``)."""

    allowOut = StringListField(required=False, allow_null=True, max_items=MAX_RULES)
    denyOut = StringListField(required=False, allow_null=True, max_items=MAX_RULES)
    dnsServers = StringListField(required=False, allow_null=True, max_items=10)
    rules = NetworkRulesField(required=False, allow_null=True)
    egressProxy = EgressProxySerializer(required=False, allow_null=True)

    def validate_allowOut(self, value: list[str] | None) -> list[str] | None:
        for entry in value or []:
            net = _cidr(entry)
            if net is None:
                if not DOMAIN.fullmatch(entry.lower().rstrip(".")):
                    raise serializers.ValidationError(f"invalid allowed address {entry}")
            elif net.version != 4:
                raise serializers.ValidationError(f"IPv6 is not supported: {entry}")
            elif net.network_address.is_unspecified and net.prefixlen != 0:
                raise serializers.ValidationError(f"invalid allowed address {entry}")
        return value

    def validate_denyOut(self, value: list[str] | None) -> list[str] | None:
        for entry in value or []:
            net = _cidr(entry)
            if net is None or (net.network_address.is_unspecified and net.prefixlen != 0):
                raise serializers.ValidationError(f"invalid denied CIDR {entry}")
            if net.version != 4:
                raise serializers.ValidationError(f"IPv6 is not supported: {entry}")
        return value

    def validate_dnsServers(self, value: list[str] | None) -> list[str] | None:
        for entry in value or []:
            try:
                ipaddress.IPv4Address(entry)
            except ValueError:
                raise serializers.ValidationError(
                    f"invalid DNS server {entry}: an IPv4 address"
                ) from None
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        domains = [e for e in attrs.get("allowOut") or [] if _cidr(e) is None]
        if domains and ALL_TRAFFIC not in (attrs.get("denyOut") or []):
            raise serializers.ValidationError(
                {
                    "allowOut": [
                        "When specifying allowed domains in allow out, you must include "
                        "'ALL_TRAFFIC' in deny out to block all other traffic."
                    ]
                }
            )
        return attrs


class NetworkConfigSerializer(EgressSerializer):
    """Create's ``network``."""

    allowPublicTraffic = StrictBooleanField(required=False, allow_null=True)
    # The Host header of requests the data plane forwards to the sandbox's ports.
    maskRequestHost = StrictCharField(required=False, allow_null=True, max_length=253)

    def validate_maskRequestHost(self, value: str | None) -> str | None:
        if value is not None and (
            not value or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in value)
        ):
            raise serializers.ValidationError("must be a host without spaces or control characters")
        return value

    httpsPorts = serializers.JSONField(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for name, why in (
            ("httpsPorts", "HTTPS to sandbox ports is not supported by this server"),
        ):
            if attrs.get(name):
                raise serializers.ValidationError({name: [why]})
        return super().validate(attrs)


class NetworkUpdateSerializer(EgressSerializer):
    """``PUT /sandboxes/{id}/network`` (SDK ``update_network``): replaces every egress rule;
    what is omitted is cleared."""

    allow_internet_access = StrictBooleanField(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        errors = capabilities.refusals(
            {
                "allow_internet_access": (
                    attrs.get("allow_internet_access") is True,
                    Capability.INTERNET_ACCESS,
                ),
                "network": (_rules_in(attrs), Capability.NETWORK_RULES),
            }
        )
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


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
    network = NetworkConfigSerializer(required=False, allow_null=True)
    metadata = StringMapField(
        required=False, allow_null=True, max_entries=100, max_key=256, max_value=2048
    )
    envVars = StringMapField(
        required=False, allow_null=True, max_entries=200, max_key=256, max_value=32768
    )
    mcp = serializers.JSONField(required=False, allow_null=True)
    iam = IamField(required=False, allow_null=True)
    volumeMounts = serializers.ListField(
        child=VolumeMountSerializer(), required=False, allow_null=True
    )

    def validate_volumeMounts(self, value: list[dict[str, str]] | None) -> Any:
        if value and len(value) > MAX_MOUNTS_PER_SANDBOX:
            raise serializers.ValidationError(
                f"at most {MAX_MOUNTS_PER_SANDBOX} volume mounts per sandbox"
            )
        return value

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
                "network": (_rules_in(attrs.get("network")), Capability.NETWORK_RULES),
                "volumeMounts": (bool(attrs.get("volumeMounts")), Capability.VOLUME_MOUNTS),
                "autoPauseMemory": (
                    attrs.get("autoPauseMemory") is False,
                    Capability.FILESYSTEM_PAUSE,
                ),
            }
        )
        # E2B's rule: traffic wakes a sandbox by restoring its memory, which a timeout's
        # filesystem-only pause does not keep.
        if attrs.get("autoPauseMemory") is False and (attrs.get("autoResume") or {}).get("enabled"):
            errors.setdefault("autoResume", []).append(
                "auto-resume needs a pause that keeps memory: it cannot be combined with "
                "autoPauseMemory false (resume such a sandbox with connect)"
            )
        # What this service itself does not do, whatever the driver.
        service_refusals = {
            "mcp": (bool(attrs.get("mcp")), "MCP gateways are not supported by this server"),
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


def _rules_in(network: dict[str, Any] | None) -> bool:
    return any(
        (network or {}).get(k)
        for k in ("allowOut", "denyOut", "dnsServers", "rules", "egressProxy")
    )


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
        auto_pause_memory=body.get("autoPauseMemory", True),
        auto_resume=bool((body.get("autoResume") or {}).get("enabled")),
        metadata=body.get("metadata") or {},
        env_vars=body.get("envVars") or {},
        allow_internet=allow_internet(body.get("allow_internet_access")),
        network=body.get("network") or {},
        volume_mounts=tuple((m["name"], m["path"]) for m in body.get("volumeMounts") or ()),
        iam=body.get("iam") or {},
    )


def allow_internet(asked: bool | None) -> bool:
    """``allow_internet_access`` as given, or the server's default when omitted (E2B's:
    allowed), which is off when the runtime has no networking."""
    if asked is not None:
        return asked
    return bool(settings.SANDBOX_INTERNET_DEFAULT) and Capability.INTERNET_ACCESS in (
        capabilities.supported()
    )


class NewSandboxV1Serializer(NewSandboxSerializer):
    timeout = StrictIntegerField(required=False, min_value=1, default=15)


class TimeoutBodySerializer(NullMeansAbsent):
    # 0 is E2B's minimum here (SandboxTimeoutRequest): the sandbox's time is up now, and the
    # lifecycle worker applies its onTimeout (kill or pause) at its next tick.
    timeout = StrictIntegerField(min_value=0)


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

    def keeps_memory(self) -> bool:
        """False: cold-boot even a sandbox that kept its memory (E2B's ``memory: false``)."""
        return self.validated_data.get("memory") is not False


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
    def get_trafficAccessToken(self, obj: Sandbox) -> str | None:
        return obj.traffic_access_token or None

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


# The columns a listed sandbox is rendered from (``.values(*LISTED_COLUMNS)``).
LISTED_COLUMNS = (
    "template_id",
    "sandbox_id",
    "alias",
    "started_at",
    "end_at",
    "cpu_count",
    "memory_mb",
    "disk_size_mb",
    "state",
    "envd_version",
    "metadata",
)
_WIRE_STATE = {str(state): wire for state, wire in Sandbox.WIRE_STATE.items()}


def listed_values(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What ``ListedSandboxSerializer(rows, many=True).data`` holds, made from plain column
    values without a field object per value (nor a model instance per row): the lists
    render thousands of rows (the v1 list, every running sandbox at once).
    ``tests/api/test_list_rendering.py`` holds the two equal."""
    return [
        {
            "templateID": row["template_id"],
            "sandboxID": row["sandbox_id"],
            "clientID": CLIENT_ID,
            "alias": row["alias"],
            "startedAt": _drf_datetime(row["started_at"]),
            "endAt": _drf_datetime(row["end_at"]),
            "cpuCount": row["cpu_count"],
            "memoryMB": row["memory_mb"],
            "diskSizeMB": row["disk_size_mb"],
            "state": _WIRE_STATE[row["state"]],
            "envdVersion": row["envd_version"],
            "metadata": {str(k): str(v) for k, v in (row["metadata"] or {}).items()},
        }
        for row in rows
    ]


def listed_rows(rows: Iterable[Sandbox]) -> list[dict[str, Any]]:
    """:func:`listed_values` of model instances (a page of the v2 list)."""
    return listed_values({name: getattr(row, name) for name in LISTED_COLUMNS} for row in rows)


def _drf_datetime(value: datetime) -> str:
    """As DRF's DateTimeField renders it with ISO 8601 output in UTC ("Z" for +00:00)."""
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class LifecycleSerializer(serializers.Serializer[Sandbox]):
    autoResume = serializers.BooleanField(source="auto_resume")
    onTimeout = serializers.CharField(source="on_timeout")


class SandboxDetailSerializer(ListedSandboxSerializer):
    envdAccessToken = serializers.CharField(source="envd_access_token")
    domain = serializers.SerializerMethodField()
    allowInternetAccess = serializers.BooleanField(source="allow_internet_access")
    network = serializers.SerializerMethodField()
    lifecycle = LifecycleSerializer(source="*")
    pauseMode = serializers.SerializerMethodField()
    # Not E2B's (the SDKs ignore it): why the sandbox is paused when nobody asked for it (its
    # processes ended under it, so it was kept with its files); null otherwise.
    pauseReason = serializers.SerializerMethodField()
    # The volumes its create named (a fork's and a snapshot's own mount none of their
    # source's).
    volumeMounts = serializers.SerializerMethodField()

    @extend_schema_field(serializers.CharField(help_text="SANDBOX_DOMAIN; never null"))
    def get_domain(self, obj: Sandbox) -> str:
        # as SandboxSerializer.get_domain: never null
        return str(settings.SANDBOX_DOMAIN)

    @extend_schema_field(serializers.DictField())
    def get_network(self, obj: Sandbox) -> dict[str, Any]:
        # As E2B echoes it: the rules as given, and whether the ports are public.
        network = dict(obj.network or {})
        network["allowPublicTraffic"] = not obj.traffic_access_token
        return network

    def get_pauseMode(self, obj: Sandbox) -> str:
        return obj.pause_mode or Sandbox.PauseMode.FULL  # what its latest pause kept

    @extend_schema_field(NULLABLE_STRING)
    def get_pauseReason(self, obj: Sandbox) -> str | None:
        return (obj.state_reason or None) if obj.wire_state == "paused" else None

    @extend_schema_field(VolumeMountSerializer(many=True))
    def get_volumeMounts(self, obj: Sandbox) -> list[dict[str, Any]]:
        return sandbox_volume_mounts(sandbox_id=obj.sandbox_id)
