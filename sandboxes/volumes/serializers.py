"""E2B wire shapes for volumes (``NewVolume``, ``Volume``, ``VolumeAndToken``) and for a
sandbox create's ``volumeMounts`` entries (``SandboxVolumeMount``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from e2bfacade.fields import NullMeansAbsent, StrictCharField
from sandboxes.models import Volume
from sandboxes.volumes import tokens


class NewVolumeSerializer(NullMeansAbsent):
    # Checked against E2B's pattern by the service, which answers E2B's own text.
    name = StrictCharField(allow_blank=True, trim_whitespace=False, max_length=1024)


class VolumeMountSerializer(NullMeansAbsent):
    """One ``{name, path}`` of a create's ``volumeMounts``; what E2B checks of them (the
    volume exists, the path is clean) is the service's, in E2B's text."""

    name = StrictCharField(allow_blank=True, trim_whitespace=False, max_length=1024)
    path = StrictCharField(allow_blank=True, trim_whitespace=False, max_length=8192)


class VolumeSerializer(serializers.Serializer[Volume]):
    volumeID = serializers.UUIDField(source="volume_id")
    name = serializers.CharField()


class VolumeAndTokenSerializer(VolumeSerializer):
    token = serializers.SerializerMethodField()
    domain = serializers.SerializerMethodField()

    def get_token(self, obj: Volume) -> str:
        return tokens.mint(obj.volume_id, obj.token_epoch)  # a fresh one per answer

    def get_domain(self, obj: Volume) -> str:
        # Never absent: without it (and E2B_DOMAIN, E2B_VOLUME_API_URL) the SDK sends the
        # content calls, the volume's token included, to api.e2b.app.
        return str(settings.SANDBOX_DOMAIN)


def volume_and_token(volume: Volume) -> dict[str, Any]:
    return dict(VolumeAndTokenSerializer(volume).data)
