"""Hostile input to the data plane, over raw HTTP: malformed bodies, wrong types, huge or
absent fields, bad envelopes, odd headers. Each gets a clear 4xx (or Connect's error in a
stream's end frame), never a 5xx, and the server goes on serving."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import httpx
import pytest
from e2b import Sandbox

from tests.support.live_server import LiveServer

UNARY = [
    "/process.Process/List",
    "/process.Process/SendInput",
    "/process.Process/SendSignal",
    "/process.Process/CloseStdin",
    "/process.Process/Update",
    "/filesystem.Filesystem/Stat",
    "/filesystem.Filesystem/ListDir",
    "/filesystem.Filesystem/MakeDir",
    "/filesystem.Filesystem/Move",
    "/filesystem.Filesystem/Remove",
    "/filesystem.Filesystem/CreateWatcher",
    "/filesystem.Filesystem/GetWatcherEvents",
    "/filesystem.Filesystem/RemoveWatcher",
]
BODIES = [
    b"",
    b"{",
    b"[]",
    b'"x"',
    b'{"path": 5}',
    b'{"path": "\\u0000"}',
    b'{"process": {"pid": -1}}',
    b'{"process": {"pid": 99999999999}}',
    b'{"process": {"tag": "nope"}, "signal": "SIGNAL_SIGHUP"}',
    b'{"path": "' + b"a" * 70000 + b'"}',
    b'{"depth": 100000, "path": "/"}',
    b'{"watcherId": "w\\u0000"}',
    b'{"source": "/etc/passwd", "destination": "/proc/1/root/x"}',
]


@pytest.fixture
def sbx(make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    return make_sandbox()


def headers(sbx: Sandbox, **extra: str) -> dict[str, str]:
    return {
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "X-Access-Token": sbx._envd_access_token or "",
        "Content-Type": "application/json",
        "Connect-Protocol-Version": "1",
        **extra,
    }


def test_malformed_unary_calls_are_4xx(sbx: Sandbox, envd_env: LiveServer) -> None:
    with httpx.Client(base_url=envd_env.sandbox_url, timeout=30) as http:
        for path in UNARY:
            for body in BODIES:
                got = http.post(path, content=body, headers=headers(sbx))
                # 501 only as envd answers it: a signal other than SIGKILL/SIGTERM.
                refused = got.status_code == 501 and got.json()["code"] == "unimplemented"
                assert got.status_code < 500 or refused, (
                    path,
                    body[:60],
                    got.status_code,
                    got.text[:200],
                )
        assert http.get("/health", headers={"E2b-Sandbox-Id": sbx.sandbox_id}).status_code == 204


def test_malformed_streams_end_with_an_error_not_a_5xx(sbx: Sandbox, envd_env: LiveServer) -> None:
    stream = {"Content-Type": "application/connect+json"}
    envelopes = [
        b"",
        b"\x00\x00\x00",
        b"\x00" + struct.pack(">I", 10) + b"{}",  # shorter than it says
        b"\x00" + struct.pack(">I", 2) + b"{}",  # no process
        b"\x00" + struct.pack(">I", 9) + b"{bad json",
        b"\x01" + struct.pack(">I", 2) + b"{}",  # "compressed"
        b"\x00" + struct.pack(">I", 1 << 30),  # a huge length, no body
        b"\x00"
        + (lambda m: struct.pack(">I", len(m)) + m)(json.dumps({"process": {"cmd": ""}}).encode()),
        b"\x00"
        + (lambda m: struct.pack(">I", len(m)) + m)(
            json.dumps({"process": {"pid": 424242}}).encode()
        ),
    ]
    with httpx.Client(base_url=envd_env.sandbox_url, timeout=30) as http:
        for path in (
            "/process.Process/Start",
            "/process.Process/Connect",
            "/filesystem.Filesystem/WatchDir",
        ):
            # ({} and the last two are a valid WatchDir of the home directory: it would wait
            # for changes, as it should.)
            valid_watch = (envelopes[3], envelopes[7], envelopes[8])
            for body in envelopes:
                if path.endswith("WatchDir") and body in valid_watch:
                    continue
                got = http.post(path, content=body, headers=headers(sbx, **stream), timeout=10)
                assert got.status_code < 500, (path, body[:40], got.status_code, got.text[:200])
                if got.status_code == 200:  # then the stream's end frame carries the error
                    assert got.content[:1] == b"\x02" and b'"error"' in got.content, got.content


def test_odd_routing_headers_are_clear_errors(sbx: Sandbox, envd_env: LiveServer) -> None:
    with httpx.Client(base_url=envd_env.sandbox_url, timeout=30) as http:
        for extra in (
            {"E2b-Sandbox-Id": "../../etc"},
            {"E2b-Sandbox-Id": "x" * 5000},
            {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "99999"},
            {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "-1"},
            {"E2b-Sandbox-Id": sbx.sandbox_id, "Authorization": "Basic !!!"},
            {"Host": "49983-UPPER.localhost"},
        ):
            got = http.post("/filesystem.Filesystem/Stat", json={"path": "/"}, headers=extra)
            assert got.status_code in (400, 401, 404, 502), (extra, got.status_code, got.text)
        for path in ("/files?path=/etc/hostname&username=nobody-here", "/files"):
            got = http.get(path, headers=headers(sbx))
            assert 400 <= got.status_code < 500, (path, got.status_code, got.text)
        # A part whose headers exceed the parser's bound (the SDK puts the path in the
        # filename): once a 500 from the parser's own error.
        huge = b'Content-Disposition: form-data; name="file"; filename="/tmp/' + b"n" * 10_000
        for content_type, body in (
            ("multipart/form-data", b"junk"),
            ("multipart/form-data; boundary=xyz", b"--xyz\r\nbroken"),
            ("multipart/form-data; boundary=xyz", b"--xyz\r\n" + huge + b'"\r\n\r\nx\r\n--xyz--'),
            ("application/octet-stream", b"no path"),
            ("text/plain", b"hello"),
        ):
            got = http.post(
                "/files", content=body, headers=headers(sbx, **{"Content-Type": content_type})
            )
            assert 400 <= got.status_code < 500, (content_type, got.status_code, got.text)
        gz = headers(
            sbx, **{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
        )
        got = http.post("/files?path=/tmp/gz", content=b"not gzip at all", headers=gz)
        assert got.status_code == 400, got.text


def test_a_refused_upload_is_answered_not_reset(sbx: Sandbox, envd_env: LiveServer) -> None:
    # The error comes before the body has been read (a bad path, a bad token), while the
    # client is still sending: the client must read the 4xx, not a reset connection.
    body = b"x" * (4 << 20)  # still being sent when the answer comes
    refused: tuple[tuple[str, dict[str, str]], ...] = (
        ("/files?path=/tmp/" + "n" * 10_000, {}),
        ("/files?path=/tmp/ok", {"X-Access-Token": "wrong"}),
    )
    with httpx.Client(base_url=envd_env.sandbox_url, timeout=30) as http:
        for _ in range(5):
            for path, extra in refused:
                got = http.post(
                    path,
                    content=body,
                    headers=headers(sbx, **{"Content-Type": "application/octet-stream", **extra}),
                )
                assert got.status_code in (400, 401), (path[:40], got.status_code, got.text)
