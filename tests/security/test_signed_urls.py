"""Signed file URLs bind the user they were signed for.

The E2B SDK's ``download_url``/``upload_url`` sign the path, the operation and the
``username`` parameter (none: the default user, ``user``) with the sandbox's access token.
Whoever holds such a URL acts as that user and no other: as in envd, ``/files`` reads no
``Authorization`` header, and a ``username`` the signature does not cover is refused.
Through the real SDK against a live server, with a secured sandbox."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from e2b import Sandbox

from tests.support.live_fixtures import point_sdk, started
from tests.support.live_server import LiveServer

ROOT_HEADER = {"Authorization": "Basic " + base64.b64encode(b"root:").decode()}
SECRET = "/tmp/root-only.txt"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with started(workers=2) as live:
        yield live


@pytest.fixture(scope="module")
def sbx(server: LiveServer) -> Iterator[Sandbox]:
    with pytest.MonkeyPatch.context() as env:
        point_sdk(env, server, server.api_key)
        sandbox = Sandbox.create(secure=True, timeout=120)
        try:
            made = sandbox.commands.run(
                f"umask 077 && echo secret > {SECRET} && stat -c %U:%a {SECRET}", user="root"
            )
            assert made.stdout == "root:600\n"
            yield sandbox
        finally:
            sandbox.kill()


def _owner(sbx: Sandbox, path: str) -> str:
    return sbx.commands.run(f"stat -c %U:%G {path}", user="root").stdout.strip()


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True)) | params
    return urlunsplit(parts._replace(query=urlencode(query)))


def test_a_download_url_for_user_reads_as_user_whatever_the_request_claims(
    sbx: Sandbox,
) -> None:
    url = sbx.download_url(SECRET)
    assert "username" not in urlsplit(url).query  # signed for the default user
    assert httpx.get(url).status_code == 403
    widened = httpx.get(url, headers=ROOT_HEADER)
    assert widened.status_code == 403, widened.text
    # Nor can the user be named in the URL: the signature covers the username parameter.
    # (The sandbox is named by header: a URL whose signature verifies against no sandbox's
    # token names no sandbox, a 400, before any signature check.)
    named = {"E2b-Sandbox-Id": sbx.sandbox_id}
    for user in ("root", "user"):
        renamed = httpx.get(_with_query(url, username=user), headers=named)
        assert renamed.status_code == 401, (user, renamed.text)
        assert renamed.json()["message"] == "invalid signature"
    signed_for_user = sbx.download_url(SECRET, user="user")
    renamed = httpx.get(_with_query(signed_for_user, username="root"), headers=named)
    assert renamed.status_code == 401, renamed.text
    assert httpx.get(signed_for_user, headers=ROOT_HEADER).status_code == 403
    # The URL still reads what its user may.
    sbx.files.write("/tmp/readable.txt", "open")
    readable = httpx.get(sbx.download_url("/tmp/readable.txt"), headers=ROOT_HEADER)
    assert readable.status_code == 200 and readable.text == "open"


def test_an_upload_url_for_user_writes_as_user_whatever_the_request_claims(
    sbx: Sandbox,
) -> None:
    sbx.files.write("/home/user/mine.txt", "before")
    assert _owner(sbx, "/home/user/mine.txt") == "user:user"
    for path in ("/home/user/mine.txt", "/tmp/new-by-url.txt"):
        sent = httpx.post(
            sbx.upload_url(path), headers=ROOT_HEADER, files={"file": ("f", b"after")}
        )
        assert sent.status_code == 200, sent.text
        assert _owner(sbx, path) == "user:user", path
        assert sbx.files.read(path) == "after"
    # A place only root may write stays closed to the user's URL, header or not.
    refused = httpx.post(
        sbx.upload_url("/root/planted.txt"), headers=ROOT_HEADER, files={"file": ("f", b"x")}
    )
    assert refused.status_code == 403, refused.text
    assert not sbx.files.exists("/root/planted.txt", user="root")
