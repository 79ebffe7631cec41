"""Sandbox routes: validate, call one service, render. Retry behaviour of each route is in
docs/idempotency.md, "Retry table", and on the service function it calls."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from e2bfacade.auth import AdminTokenAuthentication, NoApiKeyHere
from e2bfacade.errors import BadRequest
from e2bfacade.requests import json_body, team_of
from e2bfacade.schema import IDEMPOTENCY_KEY, errors
from idempotency import http as idempotency
from sandboxes import idempotent, logs, operator, selectors, services, usage
from sandboxes.admission import placement
from sandboxes.identity.views import issuer_of
from sandboxes.serializers import (
    LISTED_COLUMNS,
    ConnectSerializer,
    ListedSandboxSerializer,
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
from sandboxes.usage_serializers import (
    MaxTeamMetricSerializer,
    MetricSerializer,
    SandboxesWithMetricsSerializer,
    SandboxLogsSerializer,
    SandboxLogsV2Serializer,
    TeamMetricSerializer,
)

ADMIN_KILL_RESULT = inline_serializer(
    "AdminSandboxKillResult",
    {"killedCount": serializers.IntegerField(), "failedCount": serializers.IntegerField()},
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
        placement()
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

    @extend_schema(
        operation_id="getSandboxesMetrics",
        parameters=[
            OpenApiParameter(
                "sandbox_ids", str, required=True, description="comma-separated, at most 100"
            )
        ],
        responses={200: SandboxesWithMetricsSerializer, **errors(400)},
    )
    def batch_metrics(self, request: Request) -> Response:
        raw = request.query_params.get("sandbox_ids", "")
        # E2B's array in one parameter, comma-separated (explode: false); a repeat of an id
        # is the same sandbox.
        sandbox_ids = list(dict.fromkeys(i.strip() for i in raw.split(",") if i.strip()))
        if not sandbox_ids:
            raise BadRequest("sandbox_ids is required: a comma-separated list of sandbox IDs")
        found = services.sandboxes_metrics(team=team_of(request), sandbox_ids=sandbox_ids)
        data = {sid: MetricSerializer(metric).data for sid, metric in found.items()}
        return Response({"sandboxes": data})

    @extend_schema(
        operation_id="getSandboxLogs",
        parameters=[
            OpenApiParameter("start", int, description="ms since the epoch: entries from it on"),
            OpenApiParameter("limit", int, description="default 1000"),
        ],
        responses={200: SandboxLogsSerializer, **errors(400, 404)},
    )
    def logs_v1(self, request: Request, sandbox_id: str) -> Response:
        query = logs.parse_v1_query(request.query_params.dict())
        entries = logs.sandbox_log_read(team=team_of(request), sandbox_id=sandbox_id, query=query)
        return Response(
            {
                "logs": [logs.line_wire(e) for e in entries],
                "logEntries": [logs.entry_wire(e) for e in entries],
            }
        )

    @extend_schema(
        operation_id="getSandboxLogsV2",
        parameters=[
            OpenApiParameter("cursor", int, description="ms since the epoch"),
            OpenApiParameter("limit", int, description="0-1000, default 1000"),
            OpenApiParameter("direction", str, enum=["forward", "backward"]),
            OpenApiParameter("level", str, enum=["debug", "info", "warn", "error"]),
            OpenApiParameter("search", str, description="case-sensitive, at most 256"),
        ],
        responses={200: SandboxLogsV2Serializer, **errors(400, 404)},
    )
    def logs_v2(self, request: Request, sandbox_id: str) -> Response:
        query = logs.parse_v2_query(request.query_params.dict())
        entries = logs.sandbox_log_read(team=team_of(request), sandbox_id=sandbox_id, query=query)
        return Response({"logs": [logs.entry_wire(e) for e in entries]})


class TeamMetricsViewSet(viewsets.ViewSet):
    """A team's sandboxes over time (sandboxes/usage.py): the caller's team only."""

    @extend_schema(
        operation_id="getTeamMetrics",
        parameters=[
            OpenApiParameter("start", int, description="unix seconds; default: an hour ago"),
            OpenApiParameter("end", int, description="unix seconds; default: now"),
        ],
        responses={200: TeamMetricSerializer(many=True), **errors(400, 403)},
    )
    def metrics(self, request: Request, team_id: str) -> Response:
        team = team_of(request)
        usage.check_team(team, team_id)
        interval = usage.parse_interval(request.query_params.dict(), timezone.now())
        return Response(usage.team_metrics(team=team, interval=interval))

    @extend_schema(
        operation_id="getTeamMetricsMax",
        parameters=[
            OpenApiParameter("start", int, description="unix seconds; default: an hour ago"),
            OpenApiParameter("end", int, description="unix seconds; default: now"),
            OpenApiParameter(
                "metric", str, required=True, enum=["concurrent_sandboxes", "sandbox_start_rate"]
            ),
        ],
        responses={200: MaxTeamMetricSerializer, **errors(400, 403)},
    )
    def metrics_max(self, request: Request, team_id: str) -> Response:
        team = team_of(request)
        usage.check_team(team, team_id)
        params = request.query_params.dict()
        interval = usage.parse_interval(params, timezone.now())
        metric = params.get("metric")
        if not metric:
            raise BadRequest("metric is required: concurrent_sandboxes or sandbox_start_rate")
        return Response(usage.team_metrics_max(team=team, interval=interval, metric=metric))


class OperatorViewSet(viewsets.ViewSet):
    """E2B's admin routes for sandboxes: the operator's admin token only (see
    e2bfacade.auth.AdminTokenAuthentication); the path's teamID names the team."""

    authentication_classes = [AdminTokenAuthentication, NoApiKeyHere]

    @property
    def admin_team(self) -> bool:
        """running-counts names no team: the admin token then stands alone."""
        return bool(self.action != "running_counts")

    @extend_schema(
        operation_id="adminKillTeamSandboxes",
        request=None,
        responses={200: ADMIN_KILL_RESULT, **errors(404)},
    )
    def kill_team(self, request: Request, team_id: str) -> Response:
        killed, failed = operator.sandbox_kill_team(team=team_of(request))
        return Response({"killedCount": killed, "failedCount": failed})

    @extend_schema(
        operation_id="adminRunningSandboxCounts",
        responses={200: OpenApiTypes.OBJECT, **errors()},
    )
    def running_counts(self, request: Request) -> Response:
        return Response(operator.running_counts())


class NodeViewSet(viewsets.ViewSet):
    """E2B's ``/nodes`` admin routes (the admin token alone): this service's one host."""

    authentication_classes = [AdminTokenAuthentication, NoApiKeyHere]
    admin_team = False

    @extend_schema(operation_id="getNodes", responses={200: OpenApiTypes.OBJECT, **errors()})
    def list(self, request: Request) -> Response:
        return Response(operator.node_list())

    @extend_schema(
        operation_id="getNodesNodeID", responses={200: OpenApiTypes.OBJECT, **errors(404)}
    )
    def retrieve(self, request: Request, node_id: str) -> Response:
        return Response(operator.node_detail(node_id=node_id))

    @extend_schema(
        operation_id="postNodesNodeID",
        request=OpenApiTypes.OBJECT,
        responses={204: None, **errors(400, 404)},
    )
    def set_status(self, request: Request, node_id: str) -> Response:
        operator.node_set_status(node_id=node_id, body=json_body(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
