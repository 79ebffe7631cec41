"""The COPY archives' upload URL is a credential: whoever holds it may put that one archive
for that one team until it expires, and nothing else. Each refusal is checked on the
server's disk too (no archive, no temporary file left) and through the files link
(``present`` stays false). Raw sockets send what httpx will not (a lying Content-Length)."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from tests.contract.template_support import (
    SCRATCH,
    file_link,
    files_hash,
    request_build,
    tar_of,
    unique,
)
from tests.support.live_server import LiveServer


class Link:
    def __init__(self, server: LiveServer, template_id: str, digest: str, url: str) -> None:
        self.server, self.template_id, self.digest, self.url = server, template_id, digest, url
        parts = urlsplit(url)
        _, _, self.team, _ = parts.path.rsplit("/", 3)
        self.path = parts.path
        self.query = {k: v[0] for k, v in parse_qs(parts.query).items()}

    def with_query(self, **params: str) -> str:
        return f"{self.server.url}{self.path}?{urlencode({**self.query, **params})}"

    @property
    def stored(self) -> Path:
        return self.server.sandbox_root / "build-files" / self.team / f"{self.digest}.tar"

    def leftovers(self) -> list[str]:
        folder = self.stored.parent
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture(scope="module")
def template_id(raw: httpx.Client) -> str:
    return str(request_build(raw, SCRATCH)["templateID"])


@pytest.fixture
def link(live_server_e2b: LiveServer, raw: httpx.Client, template_id: str) -> Link:
    digest = files_hash(os.urandom(16))
    got = file_link(raw, template_id, digest)
    assert got["present"] is False
    return Link(live_server_e2b, template_id, digest, got["url"])


def _nothing_stored(raw: httpx.Client, link: Link) -> None:
    assert not link.stored.exists()
    assert [n for n in link.leftovers() if n.startswith(".upload-")] == []
    assert file_link(raw, link.template_id, link.digest)["present"] is False


def _sign(server: LiveServer, team: str, digest: str, expires: int, nonce: str) -> str:
    message = f"template-upload:{team}:{digest}:{expires}:{nonce}".encode()
    return hmac.new(server.env["SECRET_KEY"].encode(), message, hashlib.sha256).hexdigest()


def _raw_put(server: LiveServer, target: str, headers: dict[str, str], body: bytes) -> bytes:
    """A PUT on a socket: ``headers`` as given (Content-Length too), then ``body``, then the
    write side shut; returns what the server answered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        head = f"PUT {target} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "Connection: close\r\n\r\n"
        sock.sendall(head.encode() + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


# ------------------------------------------------------------------------- signatures
def test_a_good_url_stores_exactly_the_body(raw: httpx.Client, link: Link) -> None:
    data = tar_of(("file", "x.txt", "x" * 5000))
    assert httpx.put(link.url, content=data).status_code == 200
    assert link.stored.read_bytes() == data
    assert file_link(raw, link.template_id, link.digest)["present"] is True


@pytest.mark.parametrize("drop", ["signature", "expires", "both"])
def test_a_put_without_its_signature_is_403(raw: httpx.Client, link: Link, drop: str) -> None:
    query = dict(link.query)
    for key in ("signature", "expires") if drop == "both" else (drop,):
        query.pop(key)
    url = f"{link.server.url}{link.path}?{urlencode(query)}"
    r = httpx.put(url, content=b"payload")
    assert r.status_code == 403, r.text
    _nothing_stored(raw, link)


def test_a_forged_signature_is_403(raw: httpx.Client, link: Link) -> None:
    sig = link.query["signature"]
    forged = ("0" if sig[0] != "0" else "1") + sig[1:]
    assert httpx.put(link.with_query(signature=forged), content=b"x").status_code == 403
    # A longer expiry under the old signature is a forgery too.
    later = str(int(link.query["expires"]) + 3600)
    assert httpx.put(link.with_query(expires=later), content=b"x").status_code == 403
    _nothing_stored(raw, link)


def test_an_expired_signature_is_403(raw: httpx.Client, link: Link) -> None:
    past = int(time.time()) - 5
    sig = _sign(link.server, link.team, link.digest, past, link.query["nonce"])
    r = httpx.put(link.with_query(expires=str(past), signature=sig), content=b"x")
    assert r.status_code == 403
    assert "expired" in r.json()["message"]
    # The same construction with a future expiry is accepted: the check above is the
    # expiry, not a wrong way of signing.
    future = int(time.time()) + 60
    ok = _sign(link.server, link.team, link.digest, future, link.query["nonce"])
    assert httpx.put(link.with_query(expires=str(future), signature=ok), content=b"y").is_success
    assert link.stored.read_bytes() == b"y"


def test_a_url_signed_for_one_hash_cannot_write_another(raw: httpx.Client, link: Link) -> None:
    other = files_hash(b"other")
    url = f"{link.server.url}{link.path.replace(link.digest, other)}?{urlencode(link.query)}"
    assert httpx.put(url, content=b"x").status_code == 403
    assert not (link.stored.parent / f"{other}.tar").exists()
    _nothing_stored(raw, link)


def test_team_a_url_cannot_write_team_b_archive(
    raw: httpx.Client, other_http: httpx.Client, link: Link
) -> None:
    theirs = request_build(other_http, unique("uploads-b"))
    their_link = Link(
        link.server,
        theirs["templateID"],
        link.digest,
        file_link(other_http, theirs["templateID"], link.digest)["url"],
    )
    assert their_link.team != link.team
    # Our signature on their team's path.
    url = f"{link.server.url}{their_link.path}?{urlencode(link.query)}"
    assert httpx.put(url, content=b"evil").status_code == 403
    assert not their_link.stored.exists()
    assert file_link(other_http, theirs["templateID"], link.digest)["present"] is False
    # Their own archive, once uploaded, is theirs only.
    assert httpx.put(their_link.url, content=b"theirs").status_code == 200
    assert file_link(raw, link.template_id, link.digest)["present"] is False
    assert not link.stored.exists()


def test_a_template_of_another_team_has_no_files_link(
    raw: httpx.Client, other_http: httpx.Client, template_id: str
) -> None:
    r = other_http.get(f"/templates/{template_id}/files/{'c' * 64}")
    assert r.status_code == 404, r.text


# ------------------------------------------------------------------------------ bodies
def test_an_oversized_content_length_is_413_before_the_body(raw: httpx.Client, link: Link) -> None:
    limit = 1024 << 20  # TEMPLATE_FILE_MAX_MB's default
    target = link.with_query().removeprefix(link.server.url)
    began = time.monotonic()
    answer = _raw_put(link.server, target, {"Content-Length": str(limit + 1)}, b"x" * 1000)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert time.monotonic() - began < 10  # answered without waiting for 1 GiB
    _nothing_stored(raw, link)


def test_a_body_shorter_than_its_content_length_leaves_nothing(
    raw: httpx.Client, link: Link
) -> None:
    target = link.with_query().removeprefix(link.server.url)
    answer = _raw_put(link.server, target, {"Content-Length": "100000"}, b"y" * 40000)
    assert not answer.startswith(b"HTTP/1.1 2"), answer[:200]
    _nothing_stored(raw, link)


def test_concurrent_puts_of_one_hash_end_with_one_intact_archive(
    raw: httpx.Client, link: Link
) -> None:
    bodies = [bytes([65 + n]) * (3 << 20) for n in range(6)]
    # An upload URL is good for one upload: one link each, all for the same hash.
    urls = [file_link(raw, link.template_id, link.digest)["url"] for _ in bodies]
    results: list[int] = []

    def put(url: str, body: bytes) -> None:
        results.append(httpx.put(url, content=body, timeout=60).status_code)

    threads = [threading.Thread(target=put, args=(u, b)) for u, b in zip(urls, bodies, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert sorted(results) == [200] * len(bodies)
    assert link.stored.read_bytes() in bodies  # one whole body, never a mix
    assert [n for n in link.leftovers() if n.startswith(".upload-")] == []
    assert file_link(raw, link.template_id, link.digest)["present"] is True


def test_an_upload_needs_no_api_key_but_the_files_link_does(
    live_server_e2b: LiveServer, template_id: str
) -> None:
    r = httpx.get(f"{live_server_e2b.url}/templates/{template_id}/files/{'d' * 64}")
    assert r.status_code == 401
