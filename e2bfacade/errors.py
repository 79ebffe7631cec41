"""One error vocabulary, rendered in E2B's ``{code, message, error_code?}`` shape.

The E2B SDKs parse an error body before they look at the status: a body without ``code``
crashes the Python SDK with ``KeyError`` and the JS SDK decides 404/409 from ``code``. So
every error this service can produce — domain errors, DRF's own (auth, parse, throttling),
Django's 404/405/500 — goes through :func:`error_body`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django import db
from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponseBase, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """A domain error: services raise it, the exception handler renders it."""

    status = 400
    error_code: str | None = None
    # True for a refusal that provably allocated nothing and may pass later (the runtime
    # refused, a limit is reached): idempotency releases the key instead of storing it.
    releases_key = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error_code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if error_code is not None:
            self.error_code = error_code
        self.headers = headers or {}


class BadRequest(ApiError):
    status = 400


class NotFound(ApiError):
    status = 404


class Forbidden(ApiError):
    status = 403


class Conflict(ApiError):
    status = 409


class ServiceUnavailable(ApiError):
    status = 503


class NothingAllocated(ServiceUnavailable):
    """A failure that provably allocated nothing (the runtime refused before creating, and
    whatever it had made was rolled back). Idempotency releases the key on it, so the same
    key may simply try again."""

    releases_key = True


class AtCapacity(ApiError):
    """A limit is reached (the team's concurrent sandboxes, the host's memory): nothing was
    made, and the same request may succeed once something is freed. 429 as E2B answers a
    team at its concurrency limit; the key is released, never stored."""

    status = 429
    releases_key = True


def error_body(status: int, message: str, error_code: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": status, "message": message}
    if error_code:
        body["error_code"] = error_code
    return body


def _flatten_detail(detail: Any, prefix: str = "") -> list[str]:
    """DRF validation details as ``field: message`` lines a human can read."""
    if isinstance(detail, dict):
        lines: list[str] = []
        for field, sub in detail.items():
            name = field if field != "non_field_errors" else ""
            lines += _flatten_detail(sub, f"{prefix}.{name}" if prefix and name else prefix or name)
        return lines
    if isinstance(detail, list):
        return [line for item in detail for line in _flatten_detail(item, prefix)]
    return [f"{prefix}: {detail}" if prefix else str(detail)]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every API error in E2B's shape, ``code`` equal to the status."""
    if isinstance(exc, ApiError):
        return Response(
            error_body(exc.status, exc.message, exc.error_code),
            status=exc.status,
            headers=exc.headers,
        )
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = drf_exceptions.PermissionDenied()
    if isinstance(exc, drf_exceptions.APIException):
        status = exc.status_code
        code: str | None
        if isinstance(exc, drf_exceptions.ValidationError):
            message = "; ".join(_flatten_detail(exc.detail)) or "invalid request"
            code = "validation_error"
        else:
            message = str(exc.detail)
            codes = exc.get_codes()
            code = codes if isinstance(codes, str) else None
        headers: dict[str, str] = {}
        if getattr(exc, "wait", None) is not None:
            headers["Retry-After"] = str(int(exc.wait) + 1)  # type: ignore[attr-defined]
        if status == 401:
            # Without this DRF would turn 401 into 403 for a scheme-less authenticator.
            headers["WWW-Authenticate"] = "X-API-Key"
        return Response(error_body(status, message, code), status=status, headers=headers)
    if isinstance(exc, (db.OperationalError, db.InterfaceError)):
        # The database is unreachable (restarting, failing over): a transient condition the
        # SDKs retry by themselves on 503, and CONN_HEALTH_CHECKS reconnects on the next try.
        logger.warning("database unavailable: %s", exc)
        return Response(
            error_body(503, "database unavailable; retry shortly", "database_unavailable"),
            status=503,
            headers={"Retry-After": "1"},
        )
    return None  # an unexpected exception: Django's handler500 below renders it


def _json_error(status: int, message: str) -> JsonResponse:
    return JsonResponse(error_body(status, message), status=status)


def handler404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _json_error(404, f"no route for {request.method} {request.path}")


def handler400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    if isinstance(exception, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return _json_error(413, f"request body exceeds the limit of {limit} bytes")
    return _json_error(400, f"bad request: {exception}" if exception else "bad request")


def handler403(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _json_error(403, "forbidden")


def handler500(request: HttpRequest) -> JsonResponse:
    return _json_error(500, "internal server error; the failure has been logged")


class ErrorShapeMiddleware:
    """Re-render Django's own bodiless or HTML error responses in E2B's shape.

    The handlers above cover Django's 404/400/403/500, but some errors never reach them:
    ``View.http_method_not_allowed`` and ``require_http_methods`` answer 405 with an empty
    body, and with DEBUG on Django answers 404 with an HTML page. An SDK crashes on either,
    so any error response that is not already JSON is rewritten here. The admin is left
    alone: it is HTML for humans.
    """

    # Headers that carry meaning for a client and must survive the rewrite.
    _KEPT_HEADERS = ("Allow", "Retry-After", "Should-Retry", "WWW-Authenticate")

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if response.status_code < 400 or response.get("Content-Type", "").startswith(
            "application/json"
        ):
            return response
        match = request.resolver_match
        if match is not None and "admin" in match.namespaces:
            return response
        if response.status_code == 405:
            message = f"method {request.method} is not allowed on {request.path}"
        else:
            message = f"{response.reason_phrase.lower()}: {request.method} {request.path}"
        shaped = _json_error(response.status_code, message)
        for header in self._KEPT_HEADERS:
            if header in response:
                shaped[header] = response[header]
        return shaped
