"""Template wire shapes (``Template``, ``TemplateWithBuilds``, ``TemplateAliasResponse``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from e2bfacade.schema import NULLABLE_STRING
from templates.models import Template


class TemplateSerializer(serializers.Serializer[Template]):
    templateID = serializers.CharField(source="template_id")
    buildID = serializers.CharField(source="build_id")
    cpuCount = serializers.IntegerField(source="cpu_count")
    memoryMB = serializers.IntegerField(source="memory_mb")
    diskSizeMB = serializers.IntegerField(source="disk_size_mb")
    public = serializers.SerializerMethodField()
    aliases = serializers.ListField(source="names", child=serializers.CharField())
    names = serializers.ListField(child=serializers.CharField())
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    createdBy = serializers.SerializerMethodField()
    lastSpawnedAt = serializers.DateTimeField(source="last_spawned_at", allow_null=True)
    spawnCount = serializers.IntegerField(source="spawn_count")
    buildCount = serializers.SerializerMethodField()
    envdVersion = serializers.CharField(source="envd_version")
    buildStatus = serializers.SerializerMethodField()

    def get_public(self, obj: Template) -> bool:
        return obj.is_public

    @extend_schema_field(NULLABLE_STRING)
    def get_createdBy(self, obj: Template) -> None:
        return None

    def get_buildCount(self, obj: Template) -> int:
        return obj.builds.count() or 1  # an imported template is one build

    def get_buildStatus(self, obj: Template) -> str:
        """The latest build's; an imported template exists only once its image does."""
        latest = obj.builds.order_by("-created_at").values_list("status", flat=True).first()
        return str(latest or "ready")


class TemplateWithBuildsSerializer(TemplateSerializer):
    builds = serializers.SerializerMethodField()

    def get_builds(self, obj: Template) -> list[dict[str, Any]]:
        built = list(obj.builds.order_by("-created_at")[:100])
        if built:
            when = serializers.DateTimeField().to_representation
            return [
                {
                    "buildID": str(b.build_id),
                    "status": b.status,
                    "createdAt": when(b.created_at),
                    "updatedAt": when(b.finished_at or b.started_at or b.created_at),
                    "finishedAt": when(b.finished_at) if b.finished_at else None,
                    "cpuCount": b.cpu_count,
                    "memoryMB": b.memory_mb,
                    "diskSizeMB": obj.disk_size_mb,
                    "envdVersion": obj.envd_version,
                }
                for b in built
            ]
        return [
            {
                "buildID": obj.build_id,
                "status": "ready",
                "createdAt": serializers.DateTimeField().to_representation(obj.created_at),
                "updatedAt": serializers.DateTimeField().to_representation(obj.updated_at),
                "finishedAt": serializers.DateTimeField().to_representation(obj.created_at),
                "cpuCount": obj.cpu_count,
                "memoryMB": obj.memory_mb,
                "diskSizeMB": obj.disk_size_mb,
                "envdVersion": obj.envd_version,
            }
        ]


class TemplateAliasSerializer(serializers.Serializer[Any]):
    templateID = serializers.CharField()
    public = serializers.BooleanField()


class TemplateListQuerySerializer(serializers.Serializer[Any]):
    """``GET /v2/templates``'s query."""

    teamID = serializers.CharField(required=False)
    nextToken = serializers.CharField(required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=100)


class TemplateUpdateSerializer(serializers.Serializer[Any]):
    """E2B's ``TemplateUpdateRequest``: ``public`` (absent: nothing changes)."""

    public = serializers.BooleanField(required=False)

    def to_internal_value(self, data: Any) -> Any:
        # DRF's BooleanField takes "yes", 1, "true"...: the wire says a JSON boolean.
        public = data.get("public") if isinstance(data, dict) else None
        if public is not None and not isinstance(public, bool):
            raise serializers.ValidationError({"public": ["must be a boolean"]})
        return super().to_internal_value(data)


class TemplateUpdateResponseSerializer(serializers.Serializer[Any]):
    names = serializers.ListField(child=serializers.CharField())
