"""One tenant cannot exhaust the data plane: attacks made with raw sockets (half-sent
uploads, idle bodies, dropped downloads) and from inside guests (agents stopped by their
own root) on team A's sandboxes, while team B's sandbox, through the real E2B SDK, must
keep answering.

One data-plane worker (its threads are per worker) with lowered shares so that the
attacks are quick; each attack is larger than a worker's default pool (512 threads), so
that without shares it would exhaust even that.
"""

from __future__ import annotations

import base64
import contextlib
import os
import resource
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.support.live_server import LiveServer, live_server, suite_database_url
from tests.support.waiting import eventually

THREADS, SANDBOX_THREADS, TEAM_THREADS = 64, 16, 32
ADMIT_SECONDS, BODY_IDLE_SECONDS = 2, 3
LIMITS = {
    "DATAPLANE_THREADS": str(THREADS),
    "DATAPLANE_SANDBOX_THREADS": str(SANDBOX_THREADS),
    "DATAPLANE_TEAM_THREADS": str(TEAM_THREADS),
    "DATAPLANE_ADMIT_SECONDS": str(ADMIT_SECONDS),
    "DATAPLANE_BODY_IDLE_SECONDS": str(BODY_IDLE_SECONDS),
}
# More than a worker's default 512 threads: without shares, enough to exhaust them.
ATTACK = 600
# What "promptly" means for the victim: well under the agent's 30 s call timeout.
PROMPT_SECONDS = 5.0
# The guest agent's listen backlog is 128: with five stopped agents, 600 calls all wait.
STOPPED = 5


def _raise_nofile(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


_raise_nofile(4 * ATTACK)


@dataclass
class Pair:
    server: LiveServer
    a: Sandbox  # the attacker's (team A)
    b: Sandbox  # the victim's (team B)


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    """A fresh server (no attack outlives its test) with a sandbox of each team."""
    with live_server(
        suite_database_url(), workers=2, extra_env=LIMITS, dataplane_workers=1
    ) as server:
        monkeypatch.setenv("E2B_API_URL", server.url)
        monkeypatch.setenv("E2B_SANDBOX_URL", server.sandbox_url)
        monkeypatch.delenv("E2B_DEBUG", raising=False)
        a = Sandbox.create(api_key=server.api_key, timeout=600)
        b = Sandbox.create(api_key=server.other_api_key, timeout=600)
        yield Pair(server, a, b)


def _request(sbx: Sandbox, start_line: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [
        start_line,
        "Host: 127.0.0.1",
        f"E2b-Sandbox-Id: {sbx.sandbox_id}",
        f"X-Access-Token: {sbx._envd_access_token}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def half_sent_upload(sbx: Sandbox, n: int) -> bytes:
    """A ``POST /files`` that announces 100 MB and sends three bytes of it."""
    return _request(
        sbx,
        f"POST /files?path=/tmp/upload-{n}&username=user HTTP/1.1",
        {"Content-Type": "application/octet-stream", "Content-Length": "100000000"},
        b"abc",
    )


def process_list(sbx: Sandbox) -> bytes:
    """A whole unary Connect call that the guest's agent answers (``Process/List``)."""
    return _request(
        sbx,
        "POST /process.Process/List HTTP/1.1",
        {
            "Content-Type": "application/json",
            "Connect-Protocol-Version": "1",
            "Authorization": "Basic " + base64.b64encode(b"user:").decode(),
            "Content-Length": "2",
        },
        b"{}",
    )


@contextlib.contextmanager
def opened(server: LiveServer, requests: list[bytes]) -> Iterator[list[socket.socket]]:
    """One connection to the data plane per request, each request sent; all closed after."""
    socks: list[socket.socket] = []
    try:
        for request in requests:
            sock = socket.create_connection(("127.0.0.1", server.sandbox_port), timeout=10)
            socks.append(sock)
            sock.sendall(request)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def statuses(socks: list[socket.socket], seconds: float) -> list[int | None]:
    """The HTTP status each connection is answered with within ``seconds`` (None: none)."""
    got: dict[socket.socket, bytes] = {s: b"" for s in socks}
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + seconds
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                sock = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                got[sock] += data
                if not data or b"\r\n" in got[sock]:
                    sel.unregister(sock)
    out: list[int | None] = []
    for sock in socks:
        head = got[sock].split(b"\r\n", 1)[0].split()
        out.append(int(head[1]) if len(head) >= 2 and head[1].isdigit() else None)
    return out


def timed(fn: Callable[[], object]) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def serves(sbx: Sandbox) -> None:
    """A command and a file read, each bounded: they raise rather than hang."""
    out = sbx.commands.run("echo ok", timeout=15, request_timeout=15)
    assert out.stdout == "ok\n"
    assert sbx.files.read("/etc/hostname", request_timeout=15)


def test_half_sent_uploads_to_one_sandbox_leave_another_teams_sandbox_answering(
    pair: Pair,
) -> None:
    uploads = [half_sent_upload(pair.a, n) for n in range(ATTACK)]
    with opened(pair.server, uploads) as socks:
        time.sleep(0.5)  # every upload is in the worker now
        assert timed(lambda: serves(pair.b)) < PROMPT_SECONDS
        # Each upload is answered: 408 once its body stopped, 429 when its sandbox's share
        # stayed full for the admission wait. (The share's first holders end at the idle
        # time, when the last uploads opened may still be waiting: a few of those hold the
        # share next, and get 408 too.)
        answers = statuses(socks, ADMIT_SECONDS + BODY_IDLE_SECONDS + 10)
    assert set(answers) <= {408, 429}, answers
    assert answers.count(408) >= SANDBOX_THREADS
    assert answers.count(429) >= ATTACK - 2 * SANDBOX_THREADS


def test_a_sandbox_serves_again_once_its_half_sent_uploads_are_closed(pair: Pair) -> None:
    uploads = [half_sent_upload(pair.a, n) for n in range(ATTACK)]
    with opened(pair.server, uploads):
        time.sleep(0.5)
    assert timed(lambda: serves(pair.a)) < PROMPT_SECONDS
    assert timed(lambda: serves(pair.b)) < PROMPT_SECONDS
    # Uploads dropped by their client end quietly: nothing is answered, nothing logged.
    assert "Exception in ASGI application" not in pair.server.log_path.read_text()


def test_an_upload_whose_body_stops_is_answered_408_after_the_idle_time(pair: Pair) -> None:
    with opened(pair.server, [half_sent_upload(pair.a, 0)]) as socks:
        started = time.monotonic()
        (status,) = statuses(socks, BODY_IDLE_SECONDS + 10)
        waited = time.monotonic() - started
    assert status == 408
    assert BODY_IDLE_SECONDS - 0.5 <= waited < BODY_IDLE_SECONDS + 3


def test_guests_that_stop_their_own_agents_do_not_block_another_teams_sandbox(
    pair: Pair,
) -> None:
    # An agent takes at most AGENT_BACKLOG connections waiting to be accepted (the rest
    # fail at once), so a team that wants every thread of a worker stops several agents.
    stopped = [pair.a] + [
        Sandbox.create(api_key=pair.server.api_key, timeout=600) for _ in range(STOPPED - 1)
    ]
    for sbx in stopped:
        # Guest root stops its sandbox's agent (from a background shell, once this command
        # has been answered): every call the agent must answer then waits out its timeout.
        sbx.commands.run(
            "(sleep 0.3; pkill -STOP -x e2b-agent) >/dev/null 2>&1 &", user="root", timeout=15
        )
    time.sleep(1.5)
    calls = [process_list(stopped[n % STOPPED]) for n in range(ATTACK)]
    with opened(pair.server, calls) as socks:
        time.sleep(0.5)
        assert timed(lambda: serves(pair.b)) < PROMPT_SECONDS
        answers = statuses(socks, ADMIT_SECONDS + 5)
    # The stopped agents' team holds its share of the threads; every other call to them is
    # refused as a rate limit (Connect resource_exhausted) after the admission wait.
    assert answers.count(None) == TEAM_THREADS, answers
    assert answers.count(429) == ATTACK - TEAM_THREADS, answers


def _open_files(pid: int, name: str) -> int:
    """How many of process ``pid``'s descriptors are open on a file named ``name``."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).endswith(f"/{name}")
    return count


def test_downloads_their_clients_dropped_stop_reading_the_file(pair: Pair) -> None:
    # Sparse: 4 GiB that cost the guest nothing, and that a server would read for minutes.
    pair.a.commands.run("truncate -s 4G /tmp/dropped", timeout=15)
    download = _request(pair.a, "GET /files?path=/tmp/dropped&username=user HTTP/1.1", {}, b"")
    with opened(pair.server, [download] * 8) as socks:
        assert statuses(socks, PROMPT_SECONDS) == [200] * 8
    assert pair.server.dataplane is not None
    worker = pair.server.dataplane.pid  # one worker: the data plane's own process
    eventually(
        lambda: _open_files(worker, "dropped"),
        until=lambda n: n == 0,
        within=3,
        every=0.1,
        what="the dropped downloads' files closed",
    )
