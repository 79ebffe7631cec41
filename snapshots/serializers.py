"""Snapshot wire shapes."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from e2bfacade import capabilities
from e2bfacade.fields import (
    NullMeansAbsent,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
)
from e2bfacade.runtime.base import Capability
from sandboxes.serializers import SandboxSerializer
from templates.models import Template


class SnapshotRequestSerializer(NullMeansAbsent):
    name = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=128)
    memory = StrictBooleanField(required=False, allow_null=True)

    def validate_name(self, value: str | None) -> str | None:
        if not value:
            return None
        if not value.isascii() or not all(c.isalnum() or c in "-_.:/" for c in value):
            raise serializers.ValidationError(
                "use letters, digits, '-', '_', '.', ':' and '/' only"
            )
        return value

    def validate_memory(self, value: bool | None) -> bool | None:
        message = capabilities.refusal(Capability.MEMORY_SNAPSHOTS)
        if value is True and message:
            raise serializers.ValidationError(message)
        return value


class SnapshotInfoSerializer(serializers.Serializer[Template]):
    snapshotID = serializers.CharField(source="template_id")
    names = serializers.ListField(child=serializers.CharField())


class SnapshotListQuerySerializer(NullMeansAbsent):
    sandboxID = serializers.CharField(required=False, max_length=64)
    name = serializers.CharField(required=False, max_length=128)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=100)
    nextToken = serializers.CharField(required=False, max_length=1024)


class ForkRequestSerializer(NullMeansAbsent):
    timeout = StrictIntegerField(required=False, min_value=1, default=15)
    count = StrictIntegerField(required=False, min_value=1, max_value=20, default=1)


class ForkResultSerializer(serializers.Serializer[Any]):
    """One entry per fork: a sandbox, or the error that stopped that one fork."""

    sandbox = SandboxSerializer(required=False)
    error = serializers.DictField(required=False)
