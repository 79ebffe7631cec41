"""What the retry table's tests share: sending one request many times in a row or from
several callers at once, and reading the effect back from the answers, the runtime and the
server's database. The fixtures (the server, sandboxes killed at teardown) are in
conftest.py."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.support import live_checks as lc
from tests.support.live_server import LiveServer

SEQUENTIAL = [5, 50]
ROUNDS = 5
# The server stamps endAt with its own clock; the test reads its clock around the request.
CLOCK_SLACK = timedelta(seconds=1)

Send = Callable[[httpx.Client], httpx.Response]


def checked(response: httpx.Response) -> httpx.Response:
    """Never a 5xx; every error in E2B's shape."""
    request = response.request
    assert response.status_code < 500, (
        f"{request.method} {request.url.path}: {response.status_code} {response.text}"
    )
    if response.status_code >= 400:
        lc.assert_error_shape(response)
    return response


def sequential(http: httpx.Client, n: int, send: Send) -> list[httpx.Response]:
    return [checked(send(http)) for _ in range(n)]


def concurrently(server: LiveServer, send: Send, callers: int = 2) -> list[httpx.Response]:
    """``send`` from ``callers`` threads at once, each on its own connection (opened before
    the barrier, so that the barrier releases requests, not handshakes)."""
    barrier = threading.Barrier(callers)
    results: list[httpx.Response | BaseException | None] = [None] * callers

    def call(i: int) -> None:
        try:
            with lc.client(server) as client:
                client.get("/health")
                barrier.wait(timeout=30)
                results[i] = send(client)
        except BaseException as exc:  # re-raised in the test's thread below
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
        assert isinstance(result, httpx.Response), "a caller did not finish"
    return [checked(r) for r in results if isinstance(r, httpx.Response)]


def post(path: str, body: Any = None, *, key: str | None = None) -> Send:
    """``POST path`` with a JSON ``body`` (none when None) and an optional Idempotency-Key,
    as a function of the client that sends it: the same request, however often it is sent."""
    headers = {"Idempotency-Key": key} if key else {}

    def send(client: httpx.Client) -> httpx.Response:
        return client.post(path, json=body, headers=headers)

    return send


def delete(path: str) -> Send:
    def send(client: httpx.Client) -> httpx.Response:
        return client.delete(path)

    return send


def statuses(responses: list[httpx.Response]) -> list[int]:
    return [r.status_code for r in responses]


def replayed(response: httpx.Response) -> bool:
    return bool(response.headers.get("Idempotent-Replayed") == "true")


def now() -> datetime:
    return datetime.now(UTC)


def end_at(http: httpx.Client, sandbox_id: str) -> datetime:
    response = checked(http.get(f"/sandboxes/{sandbox_id}"))
    assert response.status_code == 200, response.text
    return datetime.fromisoformat(response.json()["endAt"])


def key() -> str:
    return str(uuid.uuid4())


def runtime_ids(server: LiveServer) -> set[str]:
    return set(lc.runtime_states(server))


def tagged_rows(server: LiveServer, tag: str) -> list[str]:
    """Ids of every sandbox row (any state) whose metadata carries ``tag``."""
    return sorted(lc.tagged_rows(server, tag))


def listed_with_tag(http: httpx.Client, tag: str) -> list[str]:
    response = checked(http.get("/v2/sandboxes", params={"metadata": f"tag={tag}"}))
    assert response.status_code == 200, response.text
    return sorted(s["sandboxID"] for s in response.json())


def record_count(server: LiveServer, idempotency_key: str) -> int:
    rows = lc.query(
        server,
        "SELECT count(*) FROM idempotency_idempotencyrecord WHERE key = %s",
        (idempotency_key,),
    )
    return int(rows[0][0])


def pause(http: httpx.Client, sandbox_id: str) -> None:
    response = checked(http.post(f"/sandboxes/{sandbox_id}/pause"))
    assert response.status_code == 204, response.text


def connect_path(version: str, sandbox_id: str) -> str:
    return (
        f"/v2/sandboxes/{sandbox_id}/connect"
        if version == "v2"
        else f"/sandboxes/{sandbox_id}/connect"
    )
