"""Every error, Django's own included, comes out as ``{code, message[, error_code]}``.

pytest-django runs with DEBUG=False, as production does, so Django's error handlers apply.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import get_resolver
from rest_framework.test import APIClient

from e2bfacade import errors


def assert_e2b_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert body["code"] == status
    assert isinstance(body["message"], str) and body["message"]
    return body


@pytest.mark.django_db
def test_unknown_route_answers_404_in_e2b_shape(api_client: APIClient) -> None:
    response = api_client.get("/no/such/route")

    body = assert_e2b_error(response, 404)
    assert "/no/such/route" in body["message"]


def test_unknown_route_answers_404_in_e2b_shape_even_with_debug_on(settings: Any) -> None:
    # With DEBUG on Django answers an HTML page instead of calling handler404.
    settings.DEBUG = True

    assert_e2b_error(Client().get("/no/such/route"), 404)


@pytest.mark.django_db
@pytest.mark.urls("tests.urls")
def test_wrong_method_on_a_drf_view_answers_405_in_e2b_shape(api_client: APIClient) -> None:
    response = api_client.delete("/test/whoami")

    assert_e2b_error(response, 405)
    assert "GET" in response["Allow"]


def test_wrong_method_on_health_answers_405_in_e2b_shape(anonymous_client: APIClient) -> None:
    assert_e2b_error(anonymous_client.post("/health"), 405)


@pytest.mark.urls("tests.urls")
def test_wrong_method_on_a_plain_django_view_answers_405_in_e2b_shape() -> None:
    response = Client().post("/test/plain")

    body = assert_e2b_error(response, 405)
    assert "POST" in body["message"]
    assert "GET" in response["Allow"]


@pytest.mark.django_db
@pytest.mark.urls("tests.urls")
def test_malformed_json_body_answers_400_in_e2b_shape(api_client: APIClient) -> None:
    response = api_client.post(
        "/test/whoami", data='{"templateID": ', content_type="application/json"
    )

    body = assert_e2b_error(response, 400)
    assert "JSON" in body["message"]


@pytest.mark.django_db
@pytest.mark.urls("tests.urls")
def test_unhandled_exception_in_a_view_answers_500_in_e2b_shape(api_client: APIClient) -> None:
    api_client.raise_request_exception = False

    response = api_client.get("/test/explode")

    body = assert_e2b_error(response, 500)
    assert "boom" not in body["message"]  # internals are logged, never sent


@pytest.mark.django_db
@pytest.mark.urls("tests.urls")
def test_domain_error_renders_status_message_error_code_and_headers(
    api_client: APIClient,
) -> None:
    response = api_client.post("/test/conflict", data={}, format="json")

    body = assert_e2b_error(response, 409)
    assert body == {
        "code": 409,
        "message": "still in progress",
        "error_code": "idempotency_in_progress",
    }
    assert response["Retry-After"] == "1"


def test_admin_error_pages_stay_html_for_humans() -> None:
    # A login form posted without its CSRF token: the admin's own 403 page.
    response = Client(enforce_csrf_checks=True).post("/admin/login/", {"username": "x"})

    assert response.status_code == 403
    assert response["Content-Type"].startswith("text/html")


def test_root_urlconf_renders_django_errors_with_the_e2b_handlers() -> None:
    resolver = get_resolver()  # the real root URLconf, not a test override

    assert resolver.resolve_error_handler(400) is errors.handler400
    assert resolver.resolve_error_handler(403) is errors.handler403
    assert resolver.resolve_error_handler(404) is errors.handler404
    assert resolver.resolve_error_handler(500) is errors.handler500
