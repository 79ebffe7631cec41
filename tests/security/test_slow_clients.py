"""Clients that hold connections or send oversized requests, against a real ``manage.py
serve`` (two gunicorn sync workers behind its front, e2bfacade/front.py): half-sent
requests hold no worker, so ``/health`` and a create still answer; the request line and
headers are bounded, and what the front refuses is refused in E2B's JSON shape. A
connection that never finishes its request is closed once it is late.

One serve for the module, on its own deployment (database and sandbox root)."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from e2bfacade import front
from tests.faults.test_supervision import Serve  # serve as the supervision suite runs it
from tests.support.live_server import Deployment, TeamKey, suite_database_url

HALF_SENT = 50
ANSWER_SECONDS = 5.0  # for /health and a create, with HALF_SENT connections held open
# A held connection is the front's to close: once CLIENT_SECONDS late, with this to spare.
CLOSE_SLACK_SECONDS = 5.0
HALF_REQUEST = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # no final CRLF: the headers never end


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    with Deployment(teams=1, prefix="e2bslow", suite_url=suite_database_url()) as made:
        yield made


@pytest.fixture(scope="module")
def service(deployment: Deployment) -> Iterator[Serve]:
    serve = Serve(deployment)
    try:
        yield serve.running()
    finally:
        serve.stop()
        serve.kill_leftovers()


@pytest.fixture(scope="module")
def team(deployment: Deployment) -> TeamKey:
    return deployment.take_team()


def exchange(
    service: Serve, request: bytes, timeout: float = 10
) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as it is on a connection of its own; the status, headers (names in
    lower case) and body of the answer, read until the server closes."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=timeout) as conn:
        conn.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := conn.recv(65536)):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        # To its length (a refused body's connection may linger open), or to the close.
        length = int(headers.get("content-length", -1))
        while (length < 0 or len(body) < length) and (chunk := conn.recv(65536)):
            body += chunk
    return int(status_line.split()[1]), headers, body


def assert_e2b_error(status: int, headers: dict[str, str], body: bytes, expected: int) -> None:
    assert status == expected, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), (headers, body[:300])
    error = json.loads(body)
    assert error["code"] == expected and isinstance(error["message"], str), error


def test_half_sent_requests_leave_health_and_a_create_answering(
    service: Serve, team: TeamKey
) -> None:
    held = [socket.create_connection(("127.0.0.1", service.port)) for _ in range(HALF_SENT)]
    try:
        for conn in held:
            conn.sendall(HALF_REQUEST)
        time.sleep(0.5)  # every held connection accepted, by whoever accepts them

        with httpx.Client(base_url=service.url, timeout=ANSWER_SECONDS) as client:
            started = time.monotonic()
            health = client.get("/health")
            assert health.status_code == 200, health.text
            created = client.post(
                "/v2/sandboxes",
                json={"templateID": "base", "timeout": 120},
                headers={"X-API-Key": team.api_key},
            )
            took = time.monotonic() - started
            assert created.status_code == 201, created.text
            sandbox_id = created.json()["sandboxID"]
            killed = client.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-Key": team.api_key})
            assert killed.status_code == 204, killed.text
        assert took < ANSWER_SECONDS, f"/health and a create took {took:.1f} s"

        # None is held for ever: the front closes each once it is CLIENT_SECONDS late.
        deadline = time.monotonic() + front.CLIENT_SECONDS + CLOSE_SLACK_SECONDS
        open_ = list(held)
        while open_ and (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select(open_, [], [], left)
            for conn in readable:
                try:
                    conn.recv(65536)  # an answer, or the end of the connection
                except ConnectionResetError:
                    pass
                open_.remove(conn)
        assert not open_, f"{len(open_)} half-sent requests still open"
    finally:
        for conn in held:
            conn.close()


def test_a_20_kb_request_line_is_refused_with_414_in_e2b_shape(service: Serve) -> None:
    path = "/v2/sandboxes/" + "a" * 20_000
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()

    assert_e2b_error(*exchange(service, request), 414)


def test_a_100_kb_header_is_refused_with_400_in_e2b_shape(service: Serve) -> None:
    request = (
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: "
        + b"a" * 100_000
        + b"\r\nConnection: close\r\n\r\n"
    )

    assert_e2b_error(*exchange(service, request), 400)


def test_a_request_with_many_short_headers_within_the_bounds_reaches_the_api(
    service: Serve,
) -> None:
    # 300 header lines in under 8 kB: within the front's bounds, so gunicorn must take them
    # (its own default stops at 100, with an HTML page).
    padding = b"".join(b"X-H%d: %d\r\n" % (i, i) for i in range(300))
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n" + padding + b"Connection: close\r\n\r\n"

    status, _, body = exchange(service, request)

    assert (status, json.loads(body)) == (200, {"status": "ok"})


def test_a_body_over_the_limit_is_refused_with_413_in_e2b_shape(
    service: Serve, team: TeamKey
) -> None:
    request = (
        b"POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"X-API-Key: {team.api_key}\r\nContent-Length: {2 * 1024 * 1024}\r\n".encode()
        + b"Connection: close\r\n\r\n"
    )
    # Refused from its announced length, before any of the body is sent.
    assert_e2b_error(*exchange(service, request), 413)


def test_a_request_without_host_reaches_the_api(service: Serve) -> None:
    # HTTP/1.0 needs no Host: the API must still be able to name the address it serves.
    status, _, body = exchange(service, b"GET /health HTTP/1.0\r\n\r\n")

    assert (status, json.loads(body)) == (200, {"status": "ok"})


def test_serve_refuses_to_start_without_nginx_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(front, "nginx_binary", lambda: None)

    with pytest.raises(CommandError, match=r"nginx is not installed.*nginx-light.*--no-front"):
        call_command("serve", "--bind", "127.0.0.1:1")
