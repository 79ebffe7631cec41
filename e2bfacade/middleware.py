"""Request guards that apply to every route."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase, JsonResponse

from e2bfacade.errors import error_body


class RejectNulMiddleware:
    """A NUL byte in the path or query string is a 400. PostgreSQL text cannot hold NUL, so
    letting one through to a lookup would end in a database error (a 500) on PostgreSQL and a
    different answer on SQLite. Bodies are covered by the serializers' string fields."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if (
            "\x00" in request.path
            or "%00" in request.META.get("QUERY_STRING", "")
            or any("\x00" in v for vs in request.GET.lists() for v in [vs[0], *vs[1]])
        ):
            return JsonResponse(error_body(400, "NUL bytes are not allowed in URLs"), status=400)
        return self.get_response(request)
