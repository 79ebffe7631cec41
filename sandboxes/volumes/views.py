"""Volume routes (E2B's control API, ``X-API-KEY``): validate, call one service, render.
Retry behaviour: ``POST /volumes`` honours Idempotency-Key (sandboxes/volumes/idempotent.py);
GET is safe; DELETE is idempotent in effect (a retry finishes a delete that died half-way,
then answers 404)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from e2bfacade.requests import json_body, team_of
from e2bfacade.schema import IDEMPOTENCY_KEY, errors
from idempotency import http as idempotency
from sandboxes.volumes import selectors, services
from sandboxes.volumes.idempotent import CREATE_VOLUME
from sandboxes.volumes.serializers import (
    NewVolumeSerializer,
    VolumeAndTokenSerializer,
    VolumeSerializer,
    volume_and_token,
)


class VolumeViewSet(viewsets.ViewSet):
    lookup_field = "volume_id"

    @extend_schema(
        operation_id="postVolumes",
        request=NewVolumeSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: VolumeAndTokenSerializer, **errors(400, 403, 409, 422, 503)},
    )
    def create(self, request: Request) -> Any:
        serializer = NewVolumeSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        name = serializer.validated_data["name"]
        services.check_name(name)  # nothing is recorded for a bad name
        services.volume_runtime()  # 403 without volumes; builds the runtime outside any tx
        return idempotency.run(
            request, team=team_of(request), route=CREATE_VOLUME, params={}, body={"name": name}
        )

    @extend_schema(operation_id="getVolumes", responses={200: VolumeSerializer(many=True)})
    def list(self, request: Request) -> Response:
        rows = selectors.volume_list(team_id=team_of(request).pk).values_list("volume_id", "name")
        return Response([{"volumeID": str(pk), "name": name} for pk, name in rows])

    @extend_schema(
        operation_id="getVolumesVolumeID",
        responses={200: VolumeAndTokenSerializer, **errors(400, 404)},
    )
    def retrieve(self, request: Request, volume_id: str) -> Response:
        volume = services.volume_get(team=team_of(request), volume_id=volume_id)
        return Response(volume_and_token(volume))

    @extend_schema(
        operation_id="deleteVolumesVolumeID",
        responses={204: None, **errors(400, 403, 404, 503)},
    )
    def destroy(self, request: Request, volume_id: str) -> Response:
        services.volume_delete(team=team_of(request), volume_id=volume_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
