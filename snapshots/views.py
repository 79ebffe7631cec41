"""Snapshot routes. Creating snapshots and forks lives at /sandboxes/{id}/... (mounted by
sandboxes/urls.py); this app serves the list."""

from __future__ import annotations

from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from sandboxes.views import body, team_of
from sandboxes.serializers import SandboxSerializer
from snapshots import selectors, services
from snapshots.serializers import (
    ForkRequestSerializer,
    SnapshotInfoSerializer,
    SnapshotListQuerySerializer,
    SnapshotRequestSerializer,
)


class SnapshotViewSet(viewsets.ViewSet):
    def create(self, request: Request, sandbox_id: str) -> Response:
        serializer = SnapshotRequestSerializer(data=body(request))
        serializer.is_valid(raise_exception=True)
        snapshot = services.snapshot_create(
            team=team_of(request), sandbox_id=sandbox_id, name=serializer.validated_data.get("name")
        )
        return Response(SnapshotInfoSerializer(snapshot).data, status=status.HTTP_201_CREATED)

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
        return Response(SnapshotInfoSerializer(rows, many=True).data, headers=headers)

    def fork(self, request: Request, sandbox_id: str) -> Response:
        serializer = ForkRequestSerializer(data=body(request))
        serializer.is_valid(raise_exception=True)
        results = services.sandbox_fork(
            team=team_of(request),
            sandbox_id=sandbox_id,
            timeout=serializer.validated_data["timeout"],
            count=serializer.validated_data["count"],
        )
        rendered = [
            {"sandbox": SandboxSerializer(r["sandbox"]).data} if "sandbox" in r else r for r in results
        ]
        return Response(rendered, status=status.HTTP_201_CREATED)
