"""A test-only URLconf: the root URLconf plus tiny views that exercise auth and errors.

Use it with ``@pytest.mark.urls("tests.urls")``. Django takes the error handlers from the
active URLconf, so they are re-exported from the root one.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views import View
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from e2bfacade.errors import Conflict
from e2bfacade.urls import handler400, handler403, handler404, handler500
from e2bfacade.urls import urlpatterns as root

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]


class WhoAmIView(APIView):
    """Authenticated with the project defaults (X-API-Key); echoes the caller's team."""

    def get(self, request: Request) -> Response:
        return Response({"team": request.user.team.name})  # type: ignore[union-attr]

    def post(self, request: Request) -> Response:
        return Response({"received": request.data})


class ExplodingView(APIView):
    def get(self, request: Request) -> Response:
        raise RuntimeError("boom: a bug, not a domain error")


class ConflictView(APIView):
    def post(self, request: Request) -> Response:
        raise Conflict(
            "still in progress", error_code="idempotency_in_progress", headers={"Retry-After": "1"}
        )


class PlainDjangoView(View):
    """Not DRF: Django itself answers the 405 for any method other than GET."""

    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


urlpatterns = [
    path("test/whoami", WhoAmIView.as_view()),
    path("test/explode", ExplodingView.as_view()),
    path("test/conflict", ConflictView.as_view()),
    path("test/plain", PlainDjangoView.as_view()),
    *root,
]
