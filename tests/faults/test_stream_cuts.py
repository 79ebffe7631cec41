"""Streams cut because their sandbox ended (killed, paused) under them: the client sees a
reset connection, as when envd's VM goes away, within moments of the end (a pause freezes
the guest and ends nothing in it: the data plane's check of its sandboxes cuts those
streams), and the data plane logs one info line with the reason. A cut is expected, so its
log shows no traceback and no error."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox, SandboxNotRunningException
from e2b.envd.rpc import is_transport_failure

from tests.support.live_fixtures import point_sdk
from tests.support.live_server import LiveServer
from tests.support.waiting import eventually

# A guest service whose answer never ends on its own: a long body sent in small pieces.
TRICKLE = """
import http.server, time
class Trickle(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 30))
        self.end_headers()
        while True:
            self.wfile.write(b"x" * 1024)
            self.wfile.flush()
            time.sleep(0.05)
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Trickle).serve_forever()
"""
# A guest service that answers part of a response, then resets the connection (as one
# that dies with data unread does).
RESETTER = """
import socket, struct, time
server = socket.create_server(("0.0.0.0", 8001), reuse_port=True)
while True:
    client, _ = server.accept()
    client.recv(65536)
    client.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 100000\\r\\n\\r\\n" + b"x" * 1000)
    time.sleep(0.5)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
"""
LOG_WAIT_SECONDS = 10
# From the end's answer to the client's reset: the data plane checks once a second.
CUT_SECONDS = 4.0


@pytest.fixture
def sandbox(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    point_sdk(monkeypatch, server, server.api_key)
    sbx = Sandbox.create(timeout=600)
    try:
        yield sbx
    finally:
        Sandbox.kill(sbx.sandbox_id)


@contextlib.contextmanager
def quietly_cut(server: LiveServer, reason: str) -> Iterator[None]:
    """The block cuts one stream: the log written meanwhile (and until the data plane has
    logged the cut) holds the cut's info line and no traceback."""
    start = server.log_path.stat().st_size
    yield

    def written_since() -> str:
        with server.log_path.open("rb") as log:
            log.seek(start)
            return log.read().decode(errors="replace")

    written = eventually(
        written_since,
        until=lambda text: reason in text or "Traceback" in text,
        within=LOG_WAIT_SECONDS,
        every=0.1,
        what=f"the cut logged ({reason})",
    )
    assert "Traceback" not in written, written
    # Nor any other error of the server's ("Exception in ASGI application", "ASGI callable
    # returned without completing response").
    assert not [line for line in written.splitlines() if line.startswith("ERROR:")], written
    cuts = [line for line in written.splitlines() if "data plane: cut a stream" in line]
    assert len(cuts) == 1 and reason in cuts[0], written


@contextlib.contextmanager
def answered(client: httpx.Client, port: int) -> Iterator[httpx.Response]:
    """The first 200 of the guest's service on ``port``, its body unread: asked again until
    the service listens (the data plane answers 502 until then)."""

    def sent() -> httpx.Response | None:
        answer = client.send(client.build_request("GET", "/"), stream=True)
        if answer.status_code == 200:
            return answer
        answer.close()
        return None

    answer = eventually(sent, within=10, every=0.1, what=f"the guest's service on port {port}")
    assert answer is not None  # eventually returns a value that holds
    try:
        yield answer
    finally:
        answer.close()


@pytest.mark.parametrize("end", ["kill", "pause"])
def test_a_command_stream_cut_by_its_sandbox_ending_is_reset_and_logged_without_traceback(
    server: LiveServer, sandbox: Sandbox, end: str
) -> None:
    handle = sandbox.commands.run("sleep 60", background=True)
    ended: list[float] = []

    def end_it() -> None:
        getattr(sandbox, end)()
        ended.append(time.monotonic())

    with quietly_cut(server, "the sandbox ended while the stream was open"):
        ending = threading.Timer(0.5, end_it)
        ending.start()
        try:
            with pytest.raises(SandboxNotRunningException) as raised:
                handle.wait()
            cut = time.monotonic()
        finally:
            ending.join()
    cause = raised.value.__cause__
    assert isinstance(cause, Exception) and is_transport_failure(cause), repr(cause)
    assert ended and cut - ended[0] < CUT_SECONDS, f"cut {cut - ended[0]:.1f}s after the {end}"


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        ("kill", "the sandbox's port 8000 closed in mid-response"),
        ("pause", "the sandbox ended while the stream was open"),
    ],
)
def test_a_port_response_cut_by_its_sandbox_ending_is_reset_and_logged_without_traceback(
    server: LiveServer, sandbox: Sandbox, end: str, reason: str
) -> None:
    sandbox.files.write("/tmp/trickle.py", TRICKLE)
    sandbox.commands.run("python3 /tmp/trickle.py", background=True)
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}
    # The read timeout is past CUT_SECONDS: a response that hangs fails on its time, not
    # on the timeout's error.
    with httpx.Client(base_url=server.sandbox_url, headers=headers, timeout=10) as client:
        with answered(client, 8000) as answer:
            body = answer.iter_raw()
            assert next(body)
            with quietly_cut(server, reason):
                getattr(sandbox, end)()
                ended = time.monotonic()
                with pytest.raises(httpx.ReadError, match="Connection reset"):
                    for _ in body:
                        assert time.monotonic() - ended < CUT_SECONDS, "not cut"
            cut = time.monotonic() - ended
            assert cut < CUT_SECONDS, f"cut {cut:.1f}s after the {end}"


def test_a_download_cut_by_a_pause_is_reset_and_logged_without_traceback(
    server: LiveServer, sandbox: Sandbox
) -> None:
    # Far more than the sockets on the way buffer: the download is still under way when
    # the client stops reading for the pause.
    sandbox.commands.run("head -c 268435456 /dev/zero > /tmp/big")
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": sandbox._envd_access_token or "",
    }
    with httpx.Client(base_url=server.sandbox_url, headers=headers, timeout=10) as client:
        with client.stream("GET", "/files", params={"path": "/tmp/big"}) as answer:
            assert answer.status_code == 200
            body = answer.iter_raw()
            assert next(body)
            with quietly_cut(server, "the sandbox ended while the stream was open"):
                sandbox.pause()
                ended = time.monotonic()
                # Not reading meanwhile: read at full speed, the rest could come in before
                # the data plane's next check (once a second) on a fast host.
                time.sleep(2)
                with pytest.raises(httpx.ReadError, match="Connection reset"):
                    for _ in body:
                        assert time.monotonic() - ended < CUT_SECONDS, "not cut"
            cut = time.monotonic() - ended
    assert cut < CUT_SECONDS, f"cut {cut:.1f}s after the pause"


def test_a_port_response_the_guest_resets_is_cut_and_logged_without_traceback(
    server: LiveServer, sandbox: Sandbox
) -> None:
    sandbox.files.write("/tmp/resetter.py", RESETTER)
    sandbox.commands.run("python3 /tmp/resetter.py", background=True)
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8001"}
    with httpx.Client(base_url=server.sandbox_url, headers=headers, timeout=10) as client:
        with answered(client, 8001) as answer:
            body = answer.iter_raw()
            with quietly_cut(server, "the sandbox's port 8001 closed in mid-response"):
                with pytest.raises(httpx.ReadError, match="Connection reset"):
                    for _ in body:
                        pass
