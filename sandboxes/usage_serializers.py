"""The wire shapes of what the service measured and recorded of sandboxes (E2B's
``SandboxMetric``, ``SandboxesWithMetrics``, ``SandboxLogs``/``V2``, ``TeamMetric``,
``MaxTeamMetric``): read-only answers, apart from the requests' shapes in serializers.py."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


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


class SandboxesWithMetricsSerializer(serializers.Serializer[dict[str, Any]]):
    """``SandboxesWithMetrics``: each sandbox's metric, by id."""

    sandboxes = serializers.DictField(child=MetricSerializer())


class SandboxLogEntrySerializer(serializers.Serializer[dict[str, Any]]):
    """``SandboxLogEntry`` (``fields.logger``: lifecycle, start or ready)."""

    timestamp = serializers.DateTimeField()
    level = serializers.ChoiceField(choices=["debug", "info", "warn", "error"])
    message = serializers.CharField()

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        # E2B's field is named "fields", which a class attribute of a serializer cannot be.
        fields = super().get_fields()
        fields["fields"] = serializers.DictField(child=serializers.CharField())
        return fields


class SandboxLogSerializer(serializers.Serializer[dict[str, Any]]):
    """``SandboxLog``: an entry as one JSON line (level, logger, message, fields)."""

    timestamp = serializers.DateTimeField()
    line = serializers.CharField()


class SandboxLogsSerializer(serializers.Serializer[dict[str, Any]]):
    """``SandboxLogs`` (v1)."""

    logs = SandboxLogSerializer(many=True)
    logEntries = SandboxLogEntrySerializer(many=True)


class SandboxLogsV2Serializer(serializers.Serializer[dict[str, Any]]):
    """``SandboxLogsV2Response``."""

    logs = SandboxLogEntrySerializer(many=True)


class TeamMetricSerializer(serializers.Serializer[dict[str, Any]]):
    """``TeamMetric``."""

    timestamp = serializers.DateTimeField()
    timestampUnix = serializers.IntegerField()
    concurrentSandboxes = serializers.IntegerField()
    sandboxStartRate = serializers.FloatField()


class MaxTeamMetricSerializer(serializers.Serializer[dict[str, Any]]):
    """``MaxTeamMetric``."""

    timestamp = serializers.DateTimeField()
    timestampUnix = serializers.IntegerField()
    value = serializers.FloatField()
