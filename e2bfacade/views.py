"""Views of the control plane itself (not of any resource)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class HealthView(APIView):
    """``GET /health``: E2B has it and load balancers probe it, so it needs no API key.

    It deliberately checks nothing beyond "the process answers": a database outage must not
    make an orchestrator restart every web worker at once.
    """

    authentication_classes = []
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="health",
        responses={200: inline_serializer("Health", {"status": serializers.CharField()})},
    )
    def get(self, request: Request) -> Response:
        return Response({"status": "ok"})
