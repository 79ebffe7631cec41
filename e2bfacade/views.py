"""Views of the control plane itself (not of any resource): health, readiness, metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from drf_spectacular.utils import extend_schema, inline_serializer
from prometheus_client import CONTENT_TYPE_LATEST
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from e2bfacade import observability
from e2bfacade.errors import error_body
from e2bfacade.fleet import host as fleet_host

logger = logging.getLogger(__name__)


class HealthView(APIView):
    """``GET /health``: E2B has it and load balancers probe it, so it needs no API key.

    It deliberately checks nothing beyond "the process answers": a database outage must not
    make an orchestrator restart every web worker at once. Readiness is ``/health/ready``.
    """

    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = []

    @extend_schema(
        operation_id="health",
        responses={200: inline_serializer("Health", {"status": serializers.CharField()})},
    )
    def get(self, request: Request) -> Response:
        return Response({"status": "ok"})


def check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def check_runtime() -> None:
    """The runtime can be built here (root, namespaces, cgroups, a usable SANDBOX_ROOT) and
    read its images. Cheap: a directory listing; it does not start or compile sandboxd."""
    from e2bfacade.sandbox_runtime import get_runtime

    get_runtime().list_images()


# Looked up by name at each request, so a test can replace one check.
READINESS_CHECKS: dict[str, Callable[[], None]] = {
    "database": check_database,
    "runtime": check_runtime,
    # In a fleet: this host's fence holds (a fenced host takes no traffic from the front).
    "fleet": fleet_host.check_serving,
}


READINESS_RESPONSES = {
    200: inline_serializer(
        "Readiness",
        {"status": serializers.CharField(), "checks": serializers.DictField()},
    ),
    503: inline_serializer(
        "NotReady",
        {
            "code": serializers.IntegerField(),
            "message": serializers.CharField(),
            "checks": serializers.DictField(),
        },
    ),
}


class ReadinessView(APIView):
    """``GET /health/ready``: 200 when this process can serve sandbox requests (the database
    answers ``SELECT 1``, the sandbox runtime is usable and, in a fleet, the host's fence
    holds), else 503 naming the failing checks. For a load balancer's readiness probe; no
    API key.

    The body names each check's outcome but never the exception text (this route is public);
    the details go to the server log under the request's id."""

    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = []
    placement = False  # PlacementView

    @extend_schema(operation_id="healthReady", responses=READINESS_RESPONSES)
    def get(self, request: Request) -> Response:
        checks: dict[str, str] = {}
        for name, check in READINESS_CHECKS.items():
            if name == "fleet" and not settings.ETCD_ENDPOINTS:
                continue  # a fleet of one has no fence
            try:
                check()
                checks[name] = "ok"
            except Exception as exc:
                checks[name] = f"failed: {type(exc).__name__}"
                logger.warning(
                    "readiness check %s failed (request %s)",
                    name,
                    getattr(request._request, "request_id", "-"),
                    exc_info=True,
                )
        if self.placement:
            state = fleet_host.state()
            checks["placement"] = "ok" if state == "ready" else f"failed: {state}"
        failed = [name for name, outcome in checks.items() if outcome != "ok"]
        if failed:
            body = error_body(503, f"not ready: {', '.join(failed)} check failed")
            return Response({**body, "checks": checks}, status=503)
        return Response({"status": "ok", "checks": checks})


class PlacementView(ReadinessView):
    """``GET /health/placement``: ready, and in a fleet also taking new sandboxes (not
    ``draining`` or ``standby``): the front's health check for where creates go, while
    ``/health/ready`` keeps routing a draining host's own sandboxes to it."""

    placement = True

    @extend_schema(operation_id="healthPlacement", responses=READINESS_RESPONSES)
    def get(self, request: Request) -> Response:
        return super().get(request)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """``GET /metrics`` in Prometheus' text format. Unauthenticated, like /health: it holds
    counts and timings, no ids or secrets; restrict it at the proxy in a public deployment."""
    return HttpResponse(observability.scrape(), content_type=CONTENT_TYPE_LATEST)
