"""Snapshot routes: creating snapshots and forks (at E2B's /sandboxes/{id}/... paths, still
mounted by snapshots/urls.py) and the snapshot list."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from e2bfacade.requests import json_body, team_of
from e2bfacade.schema import IDEMPOTENCY_KEY, errors
from idempotency import http as idempotency
from snapshots import idempotent, selectors
from snapshots.serializers import (
    ForkRequestSerializer,
    ForkResultSerializer,
    SnapshotInfoSerializer,
    SnapshotListQuerySerializer,
    SnapshotRequestSerializer,
)


class SnapshotViewSet(viewsets.ViewSet):
    @extend_schema(
        operation_id="createSnapshot",
        request=SnapshotRequestSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: SnapshotInfoSerializer, **errors(400, 404, 409, 422, 503)},
    )
    def create(self, request: Request, sandbox_id: str) -> Any:
        serializer = SnapshotRequestSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        canonical = {"name": serializer.validated_data.get("name")}
        if serializer.validated_data.get("memory") is not None:  # absent: the driver's default
            canonical["memory"] = serializer.validated_data["memory"]
        return idempotency.run(
            request,
            team=team_of(request),
            route=idempotent.SNAPSHOT,
            params={"sandbox_id": sandbox_id},
            body=canonical,
        )

    @extend_schema(
        operation_id="listSnapshots",
        parameters=[SnapshotListQuerySerializer],
        responses={200: SnapshotInfoSerializer(many=True), **errors(400)},
    )
    def list(self, request: Request) -> Response:
        query = SnapshotListQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        q = query.validated_data
        rows, token = selectors.snapshot_list(
            team_id=team_of(request).pk,
            sandbox_id=q.get("sandboxID"),
            name=q.get("name"),
            limit=q["limit"],
            next_token=q.get("nextToken"),
        )
        headers = {"X-Next-Token": token} if token else {}
        return Response(SnapshotInfoSerializer(rows, many=True).data, headers=headers)  # type: ignore[arg-type]  # stubs don't model many=True

    @extend_schema(
        operation_id="forkSandbox",
        request=ForkRequestSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: ForkResultSerializer(many=True), **errors(400, 404, 409, 422, 503)},
    )
    def fork(self, request: Request, sandbox_id: str) -> Any:
        serializer = ForkRequestSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        return idempotency.run(
            request,
            team=team_of(request),
            route=idempotent.FORK,
            params={"sandbox_id": sandbox_id},
            body=dict(serializer.validated_data),
        )
