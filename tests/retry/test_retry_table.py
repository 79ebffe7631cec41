"""Every row of the retry table (docs/idempotency.md, "Retry table"), through a real running server.

Each row sends the same request 5 times and 50 times in a row, and from two callers at
once (two threads released by a barrier, several rounds), and asserts exactly the answers
the table documents, that the effect happened once (read back from the runtime itself and
from the server's database), and that no request ever got a 5xx. The last test checks that
the module leaked nothing: the runtime holds exactly the sandboxes the API lists as live.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.support import live_checks as lc
from tests.support.live_server import REPO, LiveServer

SEQUENTIAL = [5, 50]
ROUNDS = 5
# The server stamps endAt with its own clock; the test reads its clock around the request.
CLOCK_SLACK = timedelta(seconds=1)

Send = Callable[[httpx.Client], httpx.Response]


# ------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with lc.client(server) as client:
        yield client


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


@pytest.fixture
def tag() -> str:
    return f"retry-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def delete_template_later(server: LiveServer) -> Iterator[Callable[[str], str]]:
    """Templates and snapshots to delete at teardown, after the test's sandboxes are killed
    (``kill_later`` depends on this fixture, so it is torn down first)."""
    refs: list[str] = []

    def register(ref: str) -> str:
        refs.append(ref)
        return ref

    yield register
    with lc.client(server) as client:
        for ref in refs:
            checked(client.delete(f"/templates/{quote(ref, safe='')}"))


@pytest.fixture
def kill_later(
    server: LiveServer, delete_template_later: Callable[[str], str]
) -> Iterator[Callable[[str], str]]:
    ids: list[str] = []

    def register(sandbox_id: str) -> str:
        ids.append(sandbox_id)
        return sandbox_id

    yield register
    with lc.client(server) as client:
        for sandbox_id in ids:
            checked(client.delete(f"/sandboxes/{sandbox_id}"))


@pytest.fixture
def new_sandbox(
    http: httpx.Client, kill_later: Callable[[str], str], tag: str
) -> Callable[..., str]:
    """``new_sandbox(timeout=600, **body)``: a running sandbox, killed at teardown."""

    def make(timeout: int = 600, **body: Any) -> str:
        payload = {"templateID": "base", "timeout": timeout, "metadata": {"tag": tag}, **body}
        response = checked(http.post("/v2/sandboxes", json=payload))
        assert response.status_code == 201, response.text
        return kill_later(response.json()["sandboxID"])

    return make


def pause(http: httpx.Client, sandbox_id: str) -> None:
    response = checked(http.post(f"/sandboxes/{sandbox_id}/pause"))
    assert response.status_code == 204, response.text


def connect_path(version: str, sandbox_id: str) -> str:
    return (
        f"/v2/sandboxes/{sandbox_id}/connect"
        if version == "v2"
        else f"/sandboxes/{sandbox_id}/connect"
    )


# --------------------------------------------------------------------------------- create
CREATE_ROUTES = ["/v2/sandboxes", "/sandboxes"]


@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("route", CREATE_ROUTES)
def test_create_with_a_key_repeated_replays_the_first_201_and_makes_one_sandbox(
    server: LiveServer,
    http: httpx.Client,
    kill_later: Callable[[str], str],
    tag: str,
    route: str,
    n: int,
) -> None:
    idempotency_key = key()
    body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
    before = runtime_ids(server)

    responses = sequential(http, n, post(route, body, key=idempotency_key))

    assert statuses(responses) == [201] * n
    first = responses[0]
    sandbox_id = kill_later(first.json()["sandboxID"])
    assert not replayed(first)
    assert all(replayed(r) and r.content == first.content for r in responses[1:])
    assert runtime_ids(server) - before == {sandbox_id}
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert tagged_rows(server, tag) == [sandbox_id]
    assert listed_with_tag(http, tag) == [sandbox_id]
    assert record_count(server, idempotency_key) == 1


@pytest.mark.parametrize("route", CREATE_ROUTES)
def test_create_with_a_key_from_two_callers_at_once_makes_one_sandbox_and_one_replay(
    server: LiveServer,
    http: httpx.Client,
    kill_later: Callable[[str], str],
    route: str,
) -> None:
    for _ in range(ROUNDS):
        idempotency_key, tag = key(), f"retry-{uuid.uuid4().hex[:12]}"
        body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
        before = runtime_ids(server)

        responses = concurrently(
            server,
            post(route, body, key=idempotency_key),
        )

        assert statuses(responses) == [201, 201]
        assert responses[0].content == responses[1].content
        assert sorted(replayed(r) for r in responses) == [False, True]
        sandbox_id = kill_later(responses[0].json()["sandboxID"])
        assert runtime_ids(server) - before == {sandbox_id}
        assert tagged_rows(server, tag) == [sandbox_id]
        assert record_count(server, idempotency_key) == 1


@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("route", CREATE_ROUTES)
def test_create_without_a_key_repeated_makes_a_new_sandbox_each_time(
    server: LiveServer,
    http: httpx.Client,
    kill_later: Callable[[str], str],
    tag: str,
    route: str,
    n: int,
) -> None:
    body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
    before = runtime_ids(server)

    responses = sequential(http, n, post(route, body))

    assert statuses(responses) == [201] * n
    ids = [kill_later(r.json()["sandboxID"]) for r in responses]
    assert not any(replayed(r) for r in responses)
    assert len(set(ids)) == n
    assert runtime_ids(server) - before == set(ids)
    assert tagged_rows(server, tag) == sorted(ids)
    assert listed_with_tag(http, tag) == sorted(ids)


def test_create_without_a_key_from_two_callers_at_once_makes_two_sandboxes(
    server: LiveServer, http: httpx.Client, kill_later: Callable[[str], str], tag: str
) -> None:
    body = {"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
    made: list[str] = []
    for _ in range(ROUNDS):
        before = runtime_ids(server)
        responses = concurrently(server, post("/v2/sandboxes", body))
        assert statuses(responses) == [201, 201]
        ids = {kill_later(r.json()["sandboxID"]) for r in responses}
        assert len(ids) == 2
        assert runtime_ids(server) - before == ids
        made += ids
    assert tagged_rows(server, tag) == sorted(made)


# -------------------------------------------------------------------------------- connect
@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("version", ["v2", "v1"])
def test_connect_to_a_running_sandbox_repeated_answers_200_and_only_extends_the_end_time(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], version: str, n: int
) -> None:
    sandbox_id = new_sandbox(timeout=300)
    previous = end_at(http, sandbox_id)
    for _ in range(n):
        sent = now()
        response = checked(http.post(connect_path(version, sandbox_id), json={"timeout": 600}))
        assert response.status_code == 200, response.text
        assert response.json()["sandboxID"] == sandbox_id
        current = end_at(http, sandbox_id)
        assert current >= previous
        assert current >= sent + timedelta(seconds=600) - CLOCK_SLACK
        previous = current
    # A shorter connect never shortens it.
    response = checked(http.post(connect_path(version, sandbox_id), json={"timeout": 30}))
    assert response.status_code == 200
    assert end_at(http, sandbox_id) == previous
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]


def test_connect_to_a_running_sandbox_from_two_callers_at_once_answers_200_twice(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox(timeout=300)
    previous = end_at(http, sandbox_id)
    for _ in range(ROUNDS):
        sent = now()
        responses = concurrently(
            server, post(f"/v2/sandboxes/{sandbox_id}/connect", {"timeout": 600})
        )
        assert statuses(responses) == [200, 200]
        current = end_at(http, sandbox_id)
        assert current >= previous
        assert current >= sent + timedelta(seconds=600) - CLOCK_SLACK
        previous = current
    assert lc.runtime_state(server, sandbox_id) == "running"


@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("version", ["v2", "v1"])
def test_connect_to_a_paused_sandbox_repeated_resumes_it_once_with_201_then_answers_200(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], version: str, n: int
) -> None:
    sandbox_id = new_sandbox()
    pause(http, sandbox_id)
    assert lc.runtime_state(server, sandbox_id) == "paused"

    responses = sequential(http, n, post(connect_path(version, sandbox_id), {"timeout": 600}))

    assert statuses(responses) == [201] + [200] * (n - 1)
    assert {r.json()["sandboxID"] for r in responses} == {sandbox_id}
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]


def test_connect_to_a_paused_sandbox_from_two_callers_at_once_resumes_it_once(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox()
    for _ in range(ROUNDS):
        pause(http, sandbox_id)
        responses = concurrently(
            server, post(f"/v2/sandboxes/{sandbox_id}/connect", {"timeout": 600})
        )
        assert sorted(statuses(responses)) == [200, 201]
        assert lc.runtime_state(server, sandbox_id) == "running"
        assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]


# ---------------------------------------------------------------------------------- pause
@pytest.mark.parametrize("n", SEQUENTIAL)
def test_pause_repeated_answers_204_once_then_409_already_paused(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox()

    responses = sequential(http, n, post(f"/sandboxes/{sandbox_id}/pause"))

    assert statuses(responses) == [204] + [409] * (n - 1)
    assert all("already paused" in r.json()["message"] for r in responses[1:])
    assert lc.runtime_state(server, sandbox_id) == "paused"
    assert lc.db_row(server, sandbox_id)[0] == "paused"  # type: ignore[index]


def test_pause_from_two_callers_at_once_answers_one_204_and_one_409(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox()
    for round_ in range(ROUNDS):
        if round_:
            resumed = checked(http.post(f"/v2/sandboxes/{sandbox_id}/connect", json={}))
            assert resumed.status_code == 201
        responses = concurrently(server, post(f"/sandboxes/{sandbox_id}/pause"))
        assert sorted(statuses(responses)) == [204, 409]
        assert lc.runtime_state(server, sandbox_id) == "paused"
        assert lc.db_row(server, sandbox_id)[0] == "paused"  # type: ignore[index]


# ------------------------------------------------------------------------- legacy resume
@pytest.mark.parametrize("n", SEQUENTIAL)
def test_legacy_resume_repeated_answers_201_once_then_409_already_running(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox()
    pause(http, sandbox_id)

    responses = sequential(http, n, post(f"/sandboxes/{sandbox_id}/resume", {"timeout": 600}))

    assert statuses(responses) == [201] + [409] * (n - 1)
    assert responses[0].json()["sandboxID"] == sandbox_id
    assert all("already running" in r.json()["message"] for r in responses[1:])
    assert lc.runtime_state(server, sandbox_id) == "running"
    assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]


def test_legacy_resume_from_two_callers_at_once_answers_one_201_and_one_409(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox()
    for _ in range(ROUNDS):
        pause(http, sandbox_id)
        responses = concurrently(server, post(f"/sandboxes/{sandbox_id}/resume", {"timeout": 600}))
        assert sorted(statuses(responses)) == [201, 409]
        assert lc.runtime_state(server, sandbox_id) == "running"
        assert lc.db_row(server, sandbox_id)[0] == "running"  # type: ignore[index]


# -------------------------------------------------------------------- timeout, refreshes
@pytest.mark.parametrize("n", SEQUENTIAL)
def test_timeout_repeated_answers_204_and_sets_the_same_end_time_modulo_the_clock(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox(timeout=600)
    original = end_at(http, sandbox_id)
    for _ in range(n):
        sent = now()
        response = checked(http.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 120}))
        answered = now()
        assert response.status_code == 204, response.text
        current = end_at(http, sandbox_id)
        # endAt = now + timeout, whatever it was before: it may shorten.
        assert sent + timedelta(seconds=120) - CLOCK_SLACK <= current
        assert current <= answered + timedelta(seconds=120) + CLOCK_SLACK
        assert current < original
    assert lc.runtime_state(server, sandbox_id) == "running"


def test_timeout_from_two_callers_at_once_answers_204_twice_with_one_end_state(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox(timeout=600)
    for _ in range(ROUNDS):
        sent = now()
        responses = concurrently(server, post(f"/sandboxes/{sandbox_id}/timeout", {"timeout": 120}))
        answered = now()
        assert statuses(responses) == [204, 204]
        current = end_at(http, sandbox_id)
        assert sent + timedelta(seconds=120) - CLOCK_SLACK <= current
        assert current <= answered + timedelta(seconds=120) + CLOCK_SLACK


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_refreshes_repeated_answer_204_and_never_shorten_the_end_time(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox(timeout=60)
    previous = end_at(http, sandbox_id)
    for _ in range(n):
        sent = now()
        response = checked(http.post(f"/sandboxes/{sandbox_id}/refreshes", json={"duration": 600}))
        assert response.status_code == 204, response.text
        current = end_at(http, sandbox_id)
        assert current >= previous
        assert current >= sent + timedelta(seconds=600) - CLOCK_SLACK
        previous = current
    # A short keep-alive (under 15 s counts as 15 s) leaves the later end time alone.
    response = checked(http.post(f"/sandboxes/{sandbox_id}/refreshes", json={"duration": 0}))
    assert response.status_code == 204
    assert end_at(http, sandbox_id) == previous
    assert lc.runtime_state(server, sandbox_id) == "running"


def test_refreshes_from_two_callers_at_once_answer_204_twice_and_never_shorten(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox(timeout=60)
    previous = end_at(http, sandbox_id)
    for _ in range(ROUNDS):
        sent = now()
        responses = concurrently(
            server, post(f"/sandboxes/{sandbox_id}/refreshes", {"duration": 600})
        )
        assert statuses(responses) == [204, 204]
        current = end_at(http, sandbox_id)
        assert current >= previous
        assert current >= sent + timedelta(seconds=600) - CLOCK_SLACK
        previous = current


# ------------------------------------------------------------------------------ snapshots
def snapshot_ids_of(http: httpx.Client, sandbox_id: str) -> list[str]:
    response = checked(http.get("/snapshots", params={"sandboxID": sandbox_id}))
    assert response.status_code == 200, response.text
    return sorted(s["snapshotID"] for s in response.json())


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_snapshot_with_a_key_repeated_replays_the_first_201_and_takes_one_snapshot(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    delete_template_later: Callable[[str], str],
    n: int,
) -> None:
    sandbox_id = new_sandbox()
    idempotency_key = key()
    images_before = lc.runtime_images(server)

    responses = sequential(
        http,
        n,
        post(f"/sandboxes/{sandbox_id}/snapshots", {}, key=idempotency_key),
    )

    assert statuses(responses) == [201] * n
    first = responses[0]
    snapshot_id = delete_template_later(first.json()["snapshotID"])
    assert not replayed(first)
    assert all(replayed(r) and r.content == first.content for r in responses[1:])
    assert snapshot_ids_of(http, sandbox_id) == [snapshot_id]
    assert lc.runtime_images(server) - images_before == {snapshot_id}
    assert lc.runtime_state(server, sandbox_id) == "running"  # the source keeps running
    assert record_count(server, idempotency_key) == 1


def test_snapshot_with_a_key_from_two_callers_at_once_takes_one_snapshot(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    delete_template_later: Callable[[str], str],
) -> None:
    sandbox_id = new_sandbox()
    taken: list[str] = []
    for _ in range(ROUNDS):
        idempotency_key = key()
        images_before = lc.runtime_images(server)
        responses = concurrently(
            server,
            post(f"/sandboxes/{sandbox_id}/snapshots", {}, key=idempotency_key),
        )
        assert statuses(responses) == [201, 201]
        assert responses[0].content == responses[1].content
        assert sorted(replayed(r) for r in responses) == [False, True]
        snapshot_id = delete_template_later(responses[0].json()["snapshotID"])
        assert lc.runtime_images(server) - images_before == {snapshot_id}
        taken.append(snapshot_id)
    assert snapshot_ids_of(http, sandbox_id) == sorted(taken)


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_snapshot_without_a_key_repeated_takes_a_new_snapshot_each_time(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    delete_template_later: Callable[[str], str],
    n: int,
) -> None:
    sandbox_id = new_sandbox()
    images_before = lc.runtime_images(server)

    responses = sequential(http, n, post(f"/sandboxes/{sandbox_id}/snapshots", {}))

    assert statuses(responses) == [201] * n
    ids = [delete_template_later(r.json()["snapshotID"]) for r in responses]
    assert len(set(ids)) == n
    assert snapshot_ids_of(http, sandbox_id) == sorted(ids)
    assert lc.runtime_images(server) - images_before == set(ids)
    assert lc.runtime_state(server, sandbox_id) == "running"


def test_snapshot_without_a_key_from_two_callers_at_once_takes_two_snapshots(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    delete_template_later: Callable[[str], str],
) -> None:
    sandbox_id = new_sandbox()
    taken: list[str] = []
    for _ in range(ROUNDS):
        responses = concurrently(server, post(f"/sandboxes/{sandbox_id}/snapshots", {}))
        assert statuses(responses) == [201, 201]
        ids = {delete_template_later(r.json()["snapshotID"]) for r in responses}
        assert len(ids) == 2
        taken += ids
    assert snapshot_ids_of(http, sandbox_id) == sorted(taken)


# ----------------------------------------------------------------------------------- fork
def fork_ids(response: httpx.Response) -> list[str]:
    entries = response.json()
    assert all("sandbox" in e for e in entries), entries
    return [e["sandbox"]["sandboxID"] for e in entries]


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_fork_with_a_key_repeated_replays_the_same_forks(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    kill_later: Callable[[str], str],
    n: int,
) -> None:
    sandbox_id = new_sandbox()
    idempotency_key = key()
    before = runtime_ids(server)

    responses = sequential(
        http,
        n,
        post(f"/sandboxes/{sandbox_id}/fork", {"count": 2, "timeout": 600}, key=idempotency_key),
    )

    assert statuses(responses) == [201] * n
    first = responses[0]
    forks = [kill_later(i) for i in fork_ids(first)]
    assert len(set(forks)) == 2
    assert not replayed(first)
    assert all(replayed(r) and r.content == first.content for r in responses[1:])
    assert runtime_ids(server) - before == set(forks)
    assert all(lc.runtime_state(server, f) == "running" for f in forks)
    assert record_count(server, idempotency_key) == 1


def test_fork_with_a_key_from_two_callers_at_once_makes_one_set_of_forks(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    kill_later: Callable[[str], str],
) -> None:
    sandbox_id = new_sandbox()
    for _ in range(ROUNDS):
        idempotency_key = key()
        before = runtime_ids(server)
        responses = concurrently(
            server,
            post(
                f"/sandboxes/{sandbox_id}/fork", {"count": 2, "timeout": 600}, key=idempotency_key
            ),
        )
        assert statuses(responses) == [201, 201]
        assert responses[0].content == responses[1].content
        assert sorted(replayed(r) for r in responses) == [False, True]
        forks = {kill_later(i) for i in fork_ids(responses[0])}
        assert len(forks) == 2
        assert runtime_ids(server) - before == forks


@pytest.mark.parametrize("n", SEQUENTIAL)
def test_fork_without_a_key_repeated_makes_new_forks_each_time(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    kill_later: Callable[[str], str],
    n: int,
) -> None:
    sandbox_id = new_sandbox()
    before = runtime_ids(server)

    responses = sequential(
        http,
        n,
        post(f"/sandboxes/{sandbox_id}/fork", {"count": 1, "timeout": 600}),
    )

    assert statuses(responses) == [201] * n
    forks = [kill_later(i) for r in responses for i in fork_ids(r)]
    assert len(set(forks)) == n
    assert runtime_ids(server) - before == set(forks)


def test_fork_without_a_key_from_two_callers_at_once_makes_two_forks(
    server: LiveServer,
    http: httpx.Client,
    new_sandbox: Callable[..., str],
    kill_later: Callable[[str], str],
) -> None:
    sandbox_id = new_sandbox()
    for _ in range(ROUNDS):
        before = runtime_ids(server)
        responses = concurrently(
            server,
            post(f"/sandboxes/{sandbox_id}/fork", {"count": 1, "timeout": 600}),
        )
        assert statuses(responses) == [201, 201]
        forks = {kill_later(i) for r in responses for i in fork_ids(r)}
        assert len(forks) == 2
        assert runtime_ids(server) - before == forks


# ------------------------------------------------------------------------- DELETE sandbox
@pytest.mark.parametrize("n", SEQUENTIAL)
def test_delete_sandbox_repeated_answers_204_once_then_404_and_kills_it(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox()

    responses = sequential(http, n, delete(f"/sandboxes/{sandbox_id}"))

    assert statuses(responses) == [204] + [404] * (n - 1)
    assert lc.runtime_state(server, sandbox_id) is None
    assert lc.db_row(server, sandbox_id)[0] == "killed"  # type: ignore[index]
    assert checked(http.get(f"/sandboxes/{sandbox_id}")).status_code == 404


def test_delete_paused_sandbox_repeated_answers_204_once_then_404(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox()
    pause(http, sandbox_id)

    responses = sequential(http, 5, delete(f"/sandboxes/{sandbox_id}"))

    assert statuses(responses) == [204] + [404] * 4
    assert lc.runtime_state(server, sandbox_id) is None
    assert lc.db_row(server, sandbox_id)[0] == "killed"  # type: ignore[index]


def test_delete_sandbox_from_two_callers_at_once_answers_one_204_and_one_404(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    for _ in range(ROUNDS):
        sandbox_id = new_sandbox()
        responses = concurrently(server, delete(f"/sandboxes/{sandbox_id}"))
        assert sorted(statuses(responses)) == [204, 404]
        assert lc.runtime_state(server, sandbox_id) is None
        assert lc.db_row(server, sandbox_id)[0] == "killed"  # type: ignore[index]


# ------------------------------------------------------------------------ DELETE template
def _import_team_template(server: LiveServer, name: str) -> str:
    """A private template of the test team, imported from a tiny rootfs tarball."""
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs"
        (rootfs / "etc").mkdir(parents=True)
        (rootfs / "etc" / "hostname").write_text("tiny\n")
        tar_path = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar_path, "w") as tar:
            tar.add(rootfs, arcname=".")
        proc = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "import_template",
                name,
                str(tar_path),
                "--team",
                "contract",
            ],
            cwd=REPO,
            env=server.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()[-1]  # "imported NAME as template ID"


def _make_template(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], kind: str
) -> tuple[str, str]:
    """(the reference DELETE uses, the template id) of a fresh template of ``kind``."""
    if kind == "template":
        name = f"tiny-{uuid.uuid4().hex[:8]}"
        return name, _import_team_template(server, name)
    source = new_sandbox()
    snapshot_name = f"team/snap-{uuid.uuid4().hex[:8]}:v1" if kind == "named snapshot" else None
    response = checked(http.post(f"/sandboxes/{source}/snapshots", json={"name": snapshot_name}))
    assert response.status_code == 201, response.text
    snapshot_id = str(response.json()["snapshotID"])
    return (snapshot_name or snapshot_id), snapshot_id


@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("kind", ["snapshot", "named snapshot", "template"])
def test_delete_template_repeated_answers_204_once_then_404_and_deletes_its_image(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], kind: str, n: int
) -> None:
    ref, template_id = _make_template(server, http, new_sandbox, kind)
    assert template_id in lc.runtime_images(server)

    # The SDK url-encodes the id: a name holding '/' or ':' travels as %2F / %3A.
    responses = sequential(http, n, delete(f"/templates/{quote(ref, safe='')}"))

    assert statuses(responses) == [204] + [404] * (n - 1)
    assert template_id not in lc.runtime_images(server)
    assert template_id not in lc.template_ids(server)


def test_delete_template_while_a_sandbox_uses_it_answers_400_until_it_is_killed(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    _, snapshot_id = _make_template(server, http, new_sandbox, "snapshot")
    user = new_sandbox(templateID=snapshot_id)

    refused = sequential(http, 5, delete(f"/templates/{snapshot_id}"))
    assert statuses(refused) == [400] * 5
    assert snapshot_id in lc.runtime_images(server)

    assert checked(http.delete(f"/sandboxes/{user}")).status_code == 204
    responses = sequential(http, 5, delete(f"/templates/{snapshot_id}"))
    assert statuses(responses) == [204] + [404] * 4
    assert snapshot_id not in lc.runtime_images(server)


def test_delete_template_from_two_callers_at_once_answers_one_204_and_one_404(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    source = new_sandbox()
    for _ in range(ROUNDS * 2):
        response = checked(http.post(f"/sandboxes/{source}/snapshots", json={}))
        assert response.status_code == 201
        snapshot_id = response.json()["snapshotID"]
        responses = concurrently(server, delete(f"/templates/{snapshot_id}"))
        assert sorted(statuses(responses)) == [204, 404]
        assert snapshot_id not in lc.runtime_images(server)
        assert snapshot_id not in lc.template_ids(server)


# --------------------------------------------------------------------------- the module
def test_the_module_leaked_nothing_and_never_answered_5xx(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    """Runs last: every sandbox the tests made was killed by their teardown, so the runtime
    holds exactly what the API lists as live (here: one running, one paused), and the
    database agrees with both."""
    running, paused = new_sandbox(), new_sandbox()
    pause(http, paused)
    assert lc.api_live(http) == {running: "running", paused: "paused"}
    assert lc.runtime_states(server) == lc.api_live(http)
    assert lc.disagreements(server) == []
    assert lc.access_log_5xx(server.log_path) == []
