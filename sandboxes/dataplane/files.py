"""``GET /files`` and ``POST /files``: downloads and uploads, streamed both ways.

An upload is parsed on a thread as it arrives (multipart/form-data, or one
application/octet-stream body, gzip-encoded or not) and each file is handed to the runtime's
``write_file`` chunk by chunk: the body is never held whole, on the host or anywhere else.
Without ``X-Access-Token`` a request needs a valid signature (the SDK's signed URLs)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import functools
import hashlib
import hmac
import json
import posixpath
import re
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import parse_qs

from django.conf import settings
from python_multipart.exceptions import ParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from e2bfacade.runtime.base import GuestFileError, SandboxRuntimeError, UnknownUser
from sandboxes.dataplane import streams
from sandboxes.dataplane.target import (
    UNAUTHORIZED,
    Caller,
    cut_connection,
    header,
    json_body,
    token_ok,
)

Send = Any
Receive = Any
CHUNK = 1 << 16
BODY_WINDOW = 8  # body chunks in flight between the event loop and the writing thread
T = TypeVar("T")


class FilesError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def files_error(exc: SandboxRuntimeError, path: str) -> FilesError:
    if isinstance(exc, GuestFileError):
        if isinstance(exc, UnknownUser):
            return FilesError(401, exc.message)
        status = {
            errno.ENOENT: 404,
            errno.EISDIR: 400,
            errno.ENOTDIR: 400,
            errno.EINVAL: 400,
            errno.ENAMETOOLONG: 400,
            errno.EACCES: 403,
            errno.EPERM: 403,
            errno.EROFS: 403,
            errno.EBUSY: 400,
            errno.EXDEV: 400,
            errno.ENOTEMPTY: 400,
            errno.ELOOP: 400,
            errno.EFBIG: 507,
            errno.ENOSPC: 507,
            errno.EDQUOT: 507,
        }.get(exc.errno, 500)
        if status == 404:
            return FilesError(404, f"path '{path}' does not exist")
        if status == 507:
            return FilesError(507, f"not enough disk space to write '{path}'")
        return FilesError(status, exc.message)
    return FilesError(502, exc.message)


def signature(path: str, operation: str, user: str, token: str, expiration: str | None) -> str:
    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration else "")
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).decode().rstrip("=")


def authorize(
    caller: Caller, headers: list[tuple[bytes, bytes]], query: dict[str, str], operation: str
) -> None:
    """The access token, or a signature over the raw path, operation, user and token."""
    given = header(headers, b"x-access-token")
    token = caller.sandbox.envd_access_token
    if given is not None or token is None:
        if not token_ok(caller.sandbox, given):
            raise FilesError(401, UNAUTHORIZED)
        return
    sig = query.get("signature")
    expiration = query.get("signature_expiration")
    expected = signature(
        query.get("path", ""), operation, query.get("username", ""), token, expiration
    )
    if not sig or not hmac.compare_digest(sig, expected):
        raise FilesError(401, "invalid signature")
    if expiration is not None and (not expiration.isdigit() or int(expiration) < time.time()):
        raise FilesError(401, "signature is already expired")


def files_user(query: dict[str, str]) -> str | None:
    """The guest user a ``/files`` request acts as: its ``username`` query parameter, or
    the sandbox's default user without one. Never the ``Authorization`` header, as in
    envd, whose ``/files`` reads no such header: the signature of a signed URL covers the
    ``username`` parameter, so a header added to the URL must not act as another user."""
    return query.get("username") or None


def query_of(scope: dict[str, Any]) -> dict[str, str]:
    parsed = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


async def respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    *,
    close: bool = False,
) -> None:
    """The whole answer; ``close``: the connection ends after it (the request's body is
    left unread)."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _gone(receive: Receive) -> None:
    """Returns once the client has gone away (what follows a GET's empty body)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def download(scope: dict[str, Any], receive: Receive, send: Send, caller: Caller) -> None:
    """Each chunk is read on a thread of the sandbox's share and sent from the loop: no
    thread waits on the client, so a slow reader costs a socket and a chunk, not a thread.
    A chunk the client does not take within ``DATAPLANE_BODY_IDLE_SECONDS`` cuts the
    connection; a client that went away ends the reading (the server drops what is sent
    to it without a word, and a dropped download of a big file would otherwise be read
    to its end)."""
    query = query_of(scope)
    path = query.get("path", "")
    user = files_user(query)
    try:
        reader = await streams.call(caller.guest.read_file, path, user=user, chunk_size=CHUNK)
    except SandboxRuntimeError as exc:
        raise files_error(exc, path) from None

    name = posixpath.basename(path.rstrip("/")) or "file"
    # No Content-Length: the file may change while it is sent (and a symlink's lstat size
    # is not its target's); the body is chunked, and is what was read.
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"content-disposition", f"inline; filename={name}".encode()),
    ]
    await send_body(scope, receive, send, reader, headers, lambda exc: files_error(exc, path))


async def send_body(
    scope: dict[str, Any],
    receive: Receive,
    send: Send,
    reader: Iterator[bytes],
    headers: list[tuple[bytes, bytes]],
    refused: Callable[[SandboxRuntimeError], Exception],
) -> None:
    """Answer 200 with ``headers`` and ``reader``'s chunks, each read on a thread of the
    share and sent from the loop. The first chunk is read before the answer starts: a
    failure there raises ``refused(error)``. A chunk the client does not take within
    ``DATAPLANE_BODY_IDLE_SECONDS`` cuts the connection, a client that went away ends the
    reading, and the reader is closed in every case."""

    def close() -> None:
        getattr(reader, "close", lambda: None)()

    try:
        first = await streams.call(next, reader, b"")
    except SandboxRuntimeError as exc:
        await streams.call(close)
        raise refused(exc) from None
    except BaseException:
        await streams.call(close)
        raise
    idle = settings.DATAPLANE_BODY_IDLE_SECONDS
    gone = asyncio.ensure_future(_gone(receive))
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunk = first
        while chunk and not gone.done():
            message = {"type": "http.response.body", "body": chunk, "more_body": True}
            try:
                await asyncio.wait_for(send(message), idle)
            except TimeoutError:
                cut_connection(scope, f"the client took no data for {idle:g}s")
            chunk = await streams.call(next, reader, b"")
        if not gone.done():
            await send({"type": "http.response.body", "body": b""})
    except SandboxRuntimeError:
        # The file could not be read on (its sandbox ended, its volume went): the answer
        # is already under way, so the connection is cut, as a vanished envd's would be.
        cut_connection(scope, "the file could not be read to its end")
    finally:
        gone.cancel()
        await streams.call(close)


class _Parts:
    """A multipart body as a sequence of (headers, data chunks) parts, parsed on the
    consuming thread."""

    def __init__(self, body: Iterator[bytes], boundary: bytes) -> None:
        self.body = body
        self.events: list[tuple[str, Any]] = []
        self.header_field = b""
        self.header_value = b""
        self.headers: dict[bytes, bytes] = {}
        callbacks: Any = {
            "on_part_begin": self._begin,
            "on_header_field": lambda d, s, e: self._field(d[s:e]),
            "on_header_value": lambda d, s, e: self._value(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": lambda: self.events.append(("headers", dict(self.headers))),
            "on_part_data": lambda d, s, e: self.events.append(("data", bytes(d[s:e]))),
            "on_part_end": lambda: self.events.append(("end", None)),
        }
        self.parser = MultipartParser(boundary, callbacks, max_header_count=16)

    def _begin(self) -> None:
        self.headers = {}

    def _field(self, data: bytes) -> None:
        self.header_field += data

    def _value(self, data: bytes) -> None:
        self.header_value += data

    def _header_end(self) -> None:
        self.headers[self.header_field.lower()] = self.header_value
        self.header_field = self.header_value = b""

    def next_event(self) -> tuple[str, Any] | None:
        while not self.events:
            chunk = next(self.body, None)
            if chunk is None:
                return None
            try:
                self.parser.write(chunk)
            except ParseError as exc:  # e.g. a part's headers over the parser's bound
                raise FilesError(400, f"the multipart body is malformed: {exc}") from None
        return self.events.pop(0)

    def data(self) -> Iterator[bytes]:
        """The current part's data, up to its end."""
        while (event := self.next_event()) is not None:
            if event[0] == "end":
                return
            if event[0] == "data" and event[1]:
                yield event[1]
        raise FilesError(400, "the multipart body ended in the middle of a part")


def _gunzip(body: Iterator[bytes]) -> Iterator[bytes]:
    inflate = zlib.decompressobj(wbits=31)
    try:
        for chunk in body:
            while chunk:
                out = inflate.decompress(chunk, CHUNK)
                if out:
                    yield out
                chunk = inflate.unconsumed_tail
        if tail := inflate.flush():
            yield tail
    except zlib.error as exc:
        raise FilesError(400, f"the gzip body is not valid: {exc}") from None


METADATA_HEADER = b"x-metadata-"
TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
PRINTABLE = re.compile(r"[\x20-\x7e]*")


def metadata_of(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """``X-Metadata-<Key>: value`` headers as envd takes them: keys lowercased HTTP tokens
    of at most 246 bytes, printable ASCII values, 4096 bytes in all. Replace semantics: an
    upload without any clears the file's metadata."""
    out: dict[str, str] = {}
    for name, value in headers:
        if not name.lower().startswith(METADATA_HEADER):
            continue
        key = name[len(METADATA_HEADER) :].decode("latin-1").lower()
        text = value.decode("latin-1")
        if not TOKEN.fullmatch(key) or len(key) > 246:
            raise FilesError(400, f"invalid metadata key {key!r}")
        if not PRINTABLE.fullmatch(text):
            raise FilesError(400, f"invalid metadata value for key {key!r}")
        out[key] = text
    if sum(len(k) + len(v) for k, v in out.items()) > 4096:
        raise FilesError(400, "metadata may hold at most 4096 bytes in all")
    return out


def _write(
    caller: Caller, path: str, user: str | None, data: Iterator[bytes], metadata: dict[str, str]
) -> dict[str, Any]:
    try:
        entry = caller.guest.write_file(path, data, user=user, metadata=metadata)
    except SandboxRuntimeError as exc:
        raise files_error(exc, path) from None
    written: dict[str, Any] = {"path": entry.path, "name": entry.name, "type": "file"}
    if entry.metadata:
        written["metadata"] = dict(entry.metadata)
    return written


def _receive_upload(
    caller: Caller, scope: dict[str, Any], body: streams.Feed
) -> list[dict[str, Any]]:
    """On a thread: write every file of the body; the answer's list."""
    headers = scope["headers"]
    query = query_of(scope)
    user = files_user(query)
    content_type, options = parse_options_header(header(headers, b"content-type") or "")
    metadata = metadata_of(headers)
    chunks = iter(body)
    if content_type == b"multipart/form-data":
        boundary = options.get(b"boundary")
        if not boundary:
            raise FilesError(400, "the multipart body has no boundary")
        parts = _Parts(chunks, boundary)
        written: list[dict[str, Any]] = []
        seen: set[str] = set()
        while (event := parts.next_event()) is not None:
            if event[0] != "headers":
                continue
            _, disposition = parse_options_header(event[1].get(b"content-disposition", b""))
            if disposition.get(b"name") != b"file":
                for _ in parts.data():  # not a file part: skipped
                    pass
                continue
            path = query.get("path") or disposition.get(b"filename", b"").decode(errors="replace")
            if not path:
                raise FilesError(400, "a file part names no path (no ?path= and no filename)")
            if path in seen:
                raise FilesError(400, f"the body has two files for '{path}'")
            seen.add(path)
            written.append(_write(caller, path, user, parts.data(), metadata))
        if not written:
            raise FilesError(400, "the body holds no file")
        return written
    if content_type == b"application/octet-stream":
        target = query.get("path")
        if not target:
            raise FilesError(400, "an octet-stream upload needs ?path=")
        encoding = (header(headers, b"content-encoding") or "identity").lower()
        if encoding not in ("identity", "gzip"):
            raise FilesError(400, f"content encoding '{encoding}' is not supported")
        data = _gunzip(chunks) if encoding == "gzip" else chunks
        return [_write(caller, target, user, data, metadata)]
    raise FilesError(400, f"unsupported content type '{content_type.decode(errors='replace')}'")


async def upload(scope: dict[str, Any], receive: Receive, send: Send, caller: Caller) -> None:
    """The body is received in the loop and handed to the writing thread (a thread of the
    sandbox's share, held for the upload) without a thread of its own (:func:`receive_body`).
    A body that stops is answered 408."""
    async with streams.slot():
        try:
            written = await receive_body(
                receive, functools.partial(_receive_upload, caller, scope), window=BODY_WINDOW
            )
        except BodyStopped as exc:
            raise _stopped(exc.idle) from None
        except BodyCut:
            # No one to answer: the write is given up (its Aborted is no error of the
            # server's, and a client that opens and drops uploads by the thousand must not
            # have a traceback logged for each).
            return
    await respond(send, 200, json.dumps(written).encode())


class BodyStopped(Exception):
    """An upload's body moved less than :data:`PROGRESS` bytes in ``idle`` seconds."""

    def __init__(self, idle: float) -> None:
        super().__init__(idle)
        self.idle = idle


class BodyCut(Exception):
    """The client went away before its upload's body ended."""


async def receive_body(receive: Receive, write: Callable[[streams.Feed], T], *, window: int) -> T:
    """Receive a request's body in the event loop and hand it to ``write``, run on a thread
    of the caller's share (it holds ``streams.slot()``), through a :class:`streams.Feed` of
    ``window`` chunks: no thread waits on the loop for a chunk. A body that moves less than
    :data:`PROGRESS` bytes in ``DATAPLANE_BODY_IDLE_SECONDS`` raises BodyStopped, a client
    that goes away BodyCut (``write`` is given up in both: it meets ``streams.Aborted``);
    what ``write`` raises is raised once the rest of the body is read (within bounds)."""
    idle = settings.DATAPLANE_BODY_IDLE_SECONDS
    loop = asyncio.get_running_loop()
    # The share may have been waited for: a client that went away meanwhile gets no thread
    # (after a thousand uploads are dropped at once, each waiter would take one in turn
    # only to give it up).
    try:
        pending: dict[str, Any] | None = await asyncio.wait_for(receive(), idle)
    except TimeoutError:
        raise BodyStopped(idle) from None
    if pending is None or pending["type"] == "http.disconnect":
        raise BodyCut
    body = streams.Feed(window)
    writer = asyncio.ensure_future(streams.run(write, body))
    more = True
    try:
        since, moved = loop.time(), 0
        while more and not writer.done():
            try:
                message = pending or await _first(receive(), writer, since + idle - loop.time())
                pending = None
            except TimeoutError:
                body.abort("the upload was given up: its body stopped")
                await _quietly(writer)
                raise BodyStopped(idle) from None
            if message is None:  # the writer ended (refused the body) first
                break
            if message["type"] == "http.disconnect":
                body.abort("the client went away before the body ended")
                await _quietly(writer)
                raise BodyCut
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            moved += len(chunk)
            if moved >= PROGRESS or not more:
                since, moved = loop.time(), 0
            if chunk:
                await _first(body.put(chunk), writer, None)
        if not more:
            body.end()
        try:
            return await writer
        except Exception:
            if more:
                await _drain(receive)
            raise
    finally:
        body.abort("the upload was given up")
        # The share's thread is given back once the writer has let go of it.
        await _quietly(writer)


PROGRESS = 1 << 16  # an upload's body must move this much in DATAPLANE_BODY_IDLE_SECONDS


def _stopped(idle: float) -> FilesError:
    return FilesError(408, f"the request body sent less than {PROGRESS} bytes in {idle:g}s")


async def _first(
    work: Awaitable[T], writer: asyncio.Future[Any], timeout: float | None
) -> T | None:
    """``work``'s result, or None when ``writer`` ends first (``work`` is then dropped);
    TimeoutError after ``timeout`` seconds."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait(
            {task, writer},
            timeout=None if timeout is None else max(timeout, 0),
            return_when=asyncio.FIRST_COMPLETED,
        )
    except BaseException:
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    if not done:
        raise TimeoutError
    return None


async def _quietly(future: asyncio.Future[Any]) -> None:
    """Wait for ``future`` to end, whatever its outcome (which its owner reads)."""
    with contextlib.suppress(BaseException):
        await asyncio.shield(future)


DRAIN_LIMIT = 64 << 20  # a refused upload's rest is read (and dropped) up to this
DRAIN_SECONDS = 5.0


async def _drain(receive: Receive) -> None:
    """Read and drop what is left of a refused upload's body, within bounds.

    An error answered while the client is still sending must not be followed by a close
    with unread bytes in the socket's buffer, which the kernel turns into a reset that can
    cost the client the answer. uvicorn reads a finished request's rest itself, but not
    every server does; reading it here keeps that off the server's goodwill. (CI once saw
    the SDK get "connection error" in place of this 400; not reproduced since.) Past the
    bounds the connection is closed anyway.
    """
    left = DRAIN_LIMIT

    async def drain() -> None:
        nonlocal left
        while left > 0:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            left -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    try:
        await asyncio.wait_for(drain(), DRAIN_SECONDS)
    except TimeoutError:
        pass


async def files(scope: dict[str, Any], receive: Receive, send: Send, caller: Caller) -> None:
    query = query_of(scope)
    method = scope["method"]
    try:
        try:
            if method not in ("GET", "POST"):
                raise FilesError(405, f"method {method} is not allowed on /files")
            authorize(caller, scope["headers"], query, "read" if method == "GET" else "write")
        except FilesError:
            await _drain(receive)
            raise
        if method == "GET":
            await download(scope, receive, send, caller)
        else:
            await upload(scope, receive, send, caller)
    except streams.Busy as exc:
        # As E2B's proxy answers a rate limit: the SDKs raise it as RateLimitException.
        await _drain(receive)
        await respond(send, 429, json_body(429, exc.message))
    except FilesError as exc:
        body = json_body(exc.status, exc.message)
        await respond(send, exc.status, body, close=exc.status == 408)
