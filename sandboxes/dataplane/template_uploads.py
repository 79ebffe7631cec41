"""``PUT /templates/uploads/{team}/{hash}``: the Template SDK's COPY archives, on the
data plane. The front (e2bfacade/front.py) routes this one path here, unbuffered: the body
is never spooled by nginx, and a slow sender holds a socket and a chunk, never a gunicorn
worker (docs/templates.md, "Uploads").

The URL is checked and the body's declared size reserved (``files.upload_claim``, on a
thread: it reads and writes the database) before a byte of the body is read: a refusal is
answered at once, and the body's bytes that still come are dropped. An accepted body streams
through a :class:`streams.Feed` to the writing thread (``files.upload_write``) into the
team's directory. A body that moves less than 64 KiB in DATAPLANE_BODY_IDLE_SECONDS, or
that is still arriving TEMPLATE_UPLOAD_SECONDS after the claim, is cut with a 408; a
client that goes away is dropped. Every way out gives the reservation back but success.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from typing import Any

from django.db import close_old_connections

from e2bfacade.errors import ApiError
from sandboxes.dataplane import streams
from sandboxes.dataplane.files import (
    BodyCut,
    BodyStopped,
    _stopped,
    query_of,
    receive_body,
    respond,
)
from sandboxes.dataplane.target import header, json_body
from templates.builds import files

Scope = dict[str, Any]
Receive = Any
Send = Any

PREFIX = "/templates/uploads/"
ROUTE = re.compile(r"/templates/uploads/(?P<team>[0-9]+)/(?P<hash>[^/]+)")
BODY_WINDOW = 16  # 1 MiB-ish chunks in flight between the loop and the writing thread


def _claim(
    team_id: int, files_hash: str, query: dict[str, str], length: int | None
) -> files.Upload:
    try:
        return files.upload_claim(
            team_id=team_id, files_hash=files_hash, query=query, length=length
        )
    finally:
        close_old_connections()


def _write(upload: files.Upload, body: streams.Feed) -> int:
    try:
        return files.upload_write(upload, body)
    finally:
        close_old_connections()


def _length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body size; None without one (a chunked body: refused with a 411)."""
    if header(headers, b"transfer-encoding") is not None:
        return None
    raw = header(headers, b"content-length")
    return int(raw) if raw is not None and raw.isdigit() else None


async def _refuse(send: Send, exc: ApiError, *, close: bool = False) -> None:
    """The error, answered at once, whatever is left of the body. Left open, the connection
    drops the rest of the body as it comes (uvicorn reads a finished request's rest
    itself; nothing of it is kept), and the front closes it once it has the answer: closed
    here with the body's bytes unread, the kernel would reset it, and nginx, still sending,
    would lose the answer and tell its client something else. ``close``: for a body that
    stalled, where nothing is left to read."""
    body = json_body(exc.status, exc.message)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *([(b"connection", b"close")] if close else []),
        *((k.lower().encode(), v.encode()) for k, v in exc.headers.items()),
    ]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def upload(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1008})
        return
    route = ROUTE.fullmatch(scope.get("path", ""))
    if route is None:
        await _refuse(send, ApiError("no such upload", status=404))
        return
    if scope["method"] != "PUT":
        await _refuse(send, ApiError(f"method {scope['method']} is not allowed", status=405))
        return
    try:
        claimed: files.Upload = await streams.run(
            _claim,
            int(route["team"]),
            route["hash"],
            query_of(scope),
            _length(scope["headers"]),
        )
    except ApiError as exc:
        await _refuse(send, exc)
        return
    # The whole body within the claim's deadline: past it the receiving is cancelled, and
    # the writer meets the abort and gives the reservation back.
    receiving = receive_body(receive, functools.partial(_write, claimed), window=BODY_WINDOW)
    try:
        await asyncio.wait_for(receiving, max(claimed.deadline - time.time(), 0))
    except TimeoutError:
        await _refuse(send, files.upload_timed_out())
        return
    except BodyStopped as exc:
        stopped = _stopped(exc.idle)
        await _refuse(send, ApiError(stopped.message, status=stopped.status), close=True)
        return
    except BodyCut:
        return  # no one to answer
    except ApiError as exc:
        await _refuse(send, exc)
        return
    await respond(send, 200, b"", b"text/plain")
