"""Sandbox routes: validate, call one service, render. Retry behaviour of each route is in
docs/idempotency.md, "Retry table", and on the service function it calls."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from e2bfacade.requests import json_body, team_of
from e2bfacade.schema import IDEMPOTENCY_KEY, errors
from idempotency import http as idempotency
from sandboxes import idempotent, selectors, services
from sandboxes.admission import host_capacity
from sandboxes.identity.views import issuer_of
from sandboxes.serializers import (
    LISTED_COLUMNS,
    ConnectSerializer,
    ListedSandboxSerializer,
    MetricSerializer,
    MetricsQuerySerializer,
    NetworkUpdateSerializer,
    NewSandboxSerializer,
    NewSandboxV1Serializer,
    PauseSerializer,
    RefreshSerializer,
    ResumeSerializer,
    SandboxDetailSerializer,
    SandboxSerializer,
    TimeoutBodySerializer,
    allow_internet,
    listed_rows,
    listed_values,
)


class SandboxViewSet(viewsets.ViewSet):
    lookup_field = "sandbox_id"

    def _create(
        self, request: Request, serializer_class: type[NewSandboxSerializer], route: str
    ) -> Any:
        serializer = serializer_class(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        body = serializer.canonical()
        if body.get("iam"):  # the issuer its workload tokens name: where it was asked
            body["iam"]["issuer"] = issuer_of(request)
        # Admission reads the host's capacity inside the reserve transaction; the first read
        # in a process builds the runtime (disk, cgroups): do that here, outside it.
        host_capacity()
        return idempotency.run(request, team=team_of(request), route=route, params={}, body=body)

    @extend_schema(
        operation_id="createSandboxV2",
        request=NewSandboxSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: SandboxSerializer, **errors(400, 404, 409, 422, 503)},
    )
    def create_v2(self, request: Request) -> Any:
        return self._create(request, NewSandboxSerializer, idempotent.CREATE_V2)

    @extend_schema(
        operation_id="createSandbox",
        request=NewSandboxV1Serializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: SandboxSerializer, **errors(400, 404, 409, 422, 503)},
    )
    def create_v1(self, request: Request) -> Any:
        return self._create(request, NewSandboxV1Serializer, idempotent.CREATE_V1)

    @extend_schema(
        operation_id="listSandboxesV2",
        parameters=[
            OpenApiParameter("state", str, description="comma-separated: running,paused"),
            OpenApiParameter("metadata", str, description="url-encoded k=v&k2=v2"),
            OpenApiParameter("order", str, enum=["asc", "desc"]),
            OpenApiParameter("startedAfter", OpenApiTypes.DATETIME),
            OpenApiParameter("template", str),
            OpenApiParameter("nextToken", str),
            OpenApiParameter("limit", int, description="1-100, default 100"),
        ],
        responses={200: ListedSandboxSerializer(many=True), **errors(400)},
    )
    def list_v2(self, request: Request) -> Response:
        query = selectors.parse_list_query(request.query_params.dict())
        rows, next_token = selectors.sandbox_list(team_id=team_of(request).pk, query=query)
        headers = {"X-Next-Token": next_token} if next_token else {}
        return Response(listed_rows(rows), headers=headers)

    @extend_schema(
        operation_id="listSandboxes",
        parameters=[OpenApiParameter("metadata", str, description="url-encoded k=v&k2=v2")],
        responses={200: ListedSandboxSerializer(many=True), **errors(400)},
    )
    def list_v1(self, request: Request) -> Response | HttpResponse:
        params = request.query_params.dict()
        query = selectors.parse_list_query(
            {"metadata": params.get("metadata", ""), "state": "running"}, paged=False
        )
        # v1 has no paging: every live sandbox, in one query (on PostgreSQL, one that
        # builds the JSON body itself: thousands of rows never become Python objects).
        team_id = team_of(request).pk
        body = selectors.sandbox_list_all_json(team_id=team_id, query=query)
        if body is not None:
            return HttpResponse(body, content_type="application/json")
        rows = selectors.sandbox_list_all(team_id=team_id, query=query, columns=LISTED_COLUMNS)
        return Response(listed_values(rows))

    @extend_schema(
        operation_id="getSandbox", responses={200: SandboxDetailSerializer, **errors(404)}
    )
    def retrieve(self, request: Request, sandbox_id: str) -> Response:
        sandbox = services.sandbox_get(team=team_of(request), sandbox_id=sandbox_id)
        return Response(SandboxDetailSerializer(sandbox).data)

    @extend_schema(operation_id="killSandbox", responses={204: None, **errors(404, 503)})
    def destroy(self, request: Request, sandbox_id: str) -> Response:
        services.sandbox_kill(team=team_of(request), sandbox_id=sandbox_id)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=ConnectSerializer,
        responses={200: SandboxSerializer, 201: SandboxSerializer, **errors(400, 404, 409, 503)},
    )
    def connect(self, request: Request, sandbox_id: str) -> Response:
        serializer = ConnectSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        sandbox, resumed = services.sandbox_connect(
            team=team_of(request),
            sandbox_id=sandbox_id,
            timeout=serializer.timeout_or_default(),
            memory=serializer.keeps_memory(),
        )
        return Response(
            SandboxSerializer(sandbox).data,
            status=status.HTTP_201_CREATED if resumed else status.HTTP_200_OK,
        )

    @extend_schema(
        operation_id="resumeSandbox",
        request=ResumeSerializer,
        responses={201: SandboxSerializer, **errors(400, 404, 409, 503)},
    )
    def resume(self, request: Request, sandbox_id: str) -> Response:
        serializer = ResumeSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        sandbox = services.sandbox_resume(
            team=team_of(request),
            sandbox_id=sandbox_id,
            timeout=serializer.timeout_or_default(),
            memory=serializer.keeps_memory(),
        )
        return Response(SandboxSerializer(sandbox).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="updateSandboxNetwork",
        request=NetworkUpdateSerializer,
        responses={204: None, **errors(400, 404, 409, 503)},
    )
    def update_network(self, request: Request, sandbox_id: str) -> Response:
        serializer = NetworkUpdateSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        services.sandbox_update_network(
            team=team_of(request),
            sandbox_id=sandbox_id,
            allow_internet=allow_internet(data.pop("allow_internet_access", None)),
            network={k: data.get(k) for k in services.NETWORK_FIELDS},
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="pauseSandbox",
        request=PauseSerializer,
        responses={204: None, **errors(400, 404, 409, 503)},
    )
    def pause(self, request: Request, sandbox_id: str) -> Response:
        serializer = PauseSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        memory = serializer.validated_data.get("memory") is not False  # E2B's default: full
        services.sandbox_pause(team=team_of(request), sandbox_id=sandbox_id, memory=memory)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="setSandboxTimeout",
        request=TimeoutBodySerializer,
        responses={204: None, **errors(400, 404)},
    )
    def set_timeout(self, request: Request, sandbox_id: str) -> Response:
        serializer = TimeoutBodySerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        services.sandbox_set_timeout(
            team=team_of(request),
            sandbox_id=sandbox_id,
            timeout=serializer.validated_data["timeout"],
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="refreshSandbox",
        request=RefreshSerializer,
        responses={204: None, **errors(400, 404)},
    )
    def refresh(self, request: Request, sandbox_id: str) -> Response:
        serializer = RefreshSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        services.sandbox_refresh(
            team=team_of(request), sandbox_id=sandbox_id, duration=serializer.duration_or_default()
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="getSandboxMetrics",
        parameters=[OpenApiParameter("start", int), OpenApiParameter("end", int)],
        responses={200: MetricSerializer(many=True), **errors(400, 404)},
    )
    def metrics(self, request: Request, sandbox_id: str) -> Response:
        query = MetricsQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        sample = services.sandbox_metrics(team=team_of(request), sandbox_id=sandbox_id)
        # One sample, taken now: the local runtime keeps no metrics history. It is returned
        # when "now" lies in the requested window (the SDK's default window does).
        start = query.validated_data.get("start")
        end = query.validated_data.get("end")
        ts = sample["timestampUnix"]
        in_window = (start is None or ts >= start) and (end is None or ts <= end + 1)
        return Response(MetricSerializer([sample] if in_window else [], many=True).data)  # type: ignore[arg-type]  # stubs don't model many=True
