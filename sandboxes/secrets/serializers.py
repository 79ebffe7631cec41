"""E2B wire shapes for secrets: ``NewSecret``, ``SecretUpdate`` (in) and ``Secret`` (out,
which has no field for a value). No message here ever holds the input it refuses: a
value is a secret, and DRF's messages for the fields below do not quote it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from e2bfacade.fields import NullMeansAbsent, StrictCharField
from sandboxes.models import Secret

MAX_VALUE = 8192  # bytes: a header line's value; the proxy writes it into one
MAX_METADATA_ENTRIES = 32  # E2B's SecretMetadata bounds
MAX_METADATA_KEY = 128
MAX_METADATA_VALUE = 1024
MAX_METADATA_TOTAL = 8192


class SecretValueField(StrictCharField):
    """A value the proxy writes into an HTTP header: printable, no CR, LF or other control
    character (one would let a value add headers of its own to the request)."""

    default_error_messages = {
        **StrictCharField.default_error_messages,
        "control": "value must not contain control characters",
        "too_long": f"value must be at most {MAX_VALUE} bytes",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_blank=False, trim_whitespace=False, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        if any(ord(c) < 0x20 and c != "\t" or 0x7F <= ord(c) <= 0x9F for c in value):
            self.fail("control")
        if len(value.encode()) > MAX_VALUE:
            self.fail("too_long")
        return value


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class SecretMetadataField(serializers.Field):  # type: ignore[type-arg]
    """E2B's ``SecretMetadata``: string values, at most 32 entries, keys of at most 128
    bytes, values of at most 1024, 8192 bytes in total."""

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object of string values")
        if len(data) > MAX_METADATA_ENTRIES:
            raise serializers.ValidationError(f"at most {MAX_METADATA_ENTRIES} entries")
        total = 0
        for key, value in data.items():
            if not isinstance(value, str):
                raise serializers.ValidationError("values must be strings")
            if not key or len(key.encode()) > MAX_METADATA_KEY or "\x00" in key:
                raise serializers.ValidationError(
                    f"keys must be 1-{MAX_METADATA_KEY} bytes without NUL"
                )
            if len(value.encode()) > MAX_METADATA_VALUE or "\x00" in value:
                raise serializers.ValidationError(
                    f"values must be at most {MAX_METADATA_VALUE} bytes without NUL"
                )
            total += len(key.encode()) + len(value.encode())
        if total > MAX_METADATA_TOTAL:
            raise serializers.ValidationError(f"at most {MAX_METADATA_TOTAL} bytes in total")
        return dict(data)

    def to_representation(self, value: Any) -> dict[str, str]:
        return dict(value)


class NewSecretSerializer(NullMeansAbsent):
    # E2B's pattern and the reserved prefix are the service's to check (services.py).
    name = StrictCharField(allow_blank=True, trim_whitespace=False, max_length=1024)
    value = SecretValueField()
    metadata = SecretMetadataField(required=False)


class SecretUpdateSerializer(NullMeansAbsent):
    value = SecretValueField()
    metadata = SecretMetadataField(required=False)


class SecretSerializer(serializers.Serializer[Secret]):
    """E2B's ``Secret``: metadata of a secret. It has no field a value could be put in."""

    secretID = serializers.CharField(source="secret_id")
    name = serializers.CharField()
    currentVersion = serializers.IntegerField(source="current_version")
    metadata = SecretMetadataField()
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class SecretListQuerySerializer(NullMeansAbsent):
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=100)
    nextToken = serializers.CharField(required=False, max_length=1024)
