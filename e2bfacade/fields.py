"""Strict JSON field types: E2B's Go server rejects ``"5"`` for an integer and ``1`` for a
boolean, and so do we (DRF's own fields coerce them silently)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "must be an integer"}

    def to_internal_value(self, data: Any) -> int:
        if type(data) is not int:  # bool is an int subclass: refuse it too
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "must be true or false"}

    def to_internal_value(self, data: Any) -> bool:
        if type(data) is not bool:
            self.fail("invalid")
        return data


class StrictCharField(serializers.CharField):
    default_error_messages = {"invalid": "must be a string"}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data:
            raise serializers.ValidationError("must not contain NUL characters")
        return super().to_internal_value(data)


class StringMapField(serializers.DictField):
    """``map[string]string`` with bounded size: metadata and envVars."""

    def __init__(self, *, max_entries: int, max_key: int, max_value: int, **kwargs: Any) -> None:
        super().__init__(
            child=StrictCharField(allow_blank=True, max_length=max_value, trim_whitespace=False),
            **kwargs,
        )
        self.max_entries = max_entries
        self.max_key = max_key

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object of string values")
        if len(data) > self.max_entries:
            raise serializers.ValidationError(f"at most {self.max_entries} entries")
        for key in data:
            if not key or len(key) > self.max_key or "\x00" in key:
                raise serializers.ValidationError(
                    f"keys must be 1-{self.max_key} characters without NUL"
                )
        return super().to_internal_value(data)


class NullMeansAbsent(serializers.Serializer[Any]):
    """E2B treats ``null`` like an absent field: drop nulls before validating, so that a
    field's default applies to both (and the idempotency fingerprint sees one form)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None}
        return super().to_internal_value(data)
