"""E2B's volume content API (``/volumecontent/{volumeID}/…``, E2B's
``spec/openapi-volumecontent.yml``), served by the data plane beside envd's services.

- ``GET|PUT /volumecontent/{id}/file?path=`` (PUT: ``uid``, ``gid``, ``mode``, ``force``;
  201 with the entry), ``GET|PATCH|DELETE /volumecontent/{id}/path?path=`` (PATCH: a JSON
  body ``{uid?, gid?, mode?}``; DELETE: 204), ``GET|POST /volumecontent/{id}/dir?path=``
  (GET: ``depth``, 1 to 10; POST: ``uid``, ``gid``, ``mode``, ``force``; 201).
- Auth is ``Authorization: Bearer <volume token>`` (``sandboxes.volumes.tokens``), checked
  against the volume's row (one database read per request): no token, a malformed one,
  one of another volume, an expired or revoked one and an unknown volume all get the same
  401, so nothing says whether a volume exists. The API key is never accepted.
- Errors are ``{"code": "<status>", "message": ...}`` (the content spec's ``code`` is a
  string; E2B's own mocks send the status).
- Bodies stream both ways within the volume's team's share of the data plane's threads
  (``streams``): chunks of a download are read one at a time, an upload is handed to the
  writing thread chunk by chunk (``streams.Feed``); a body that stalls for
  ``DATAPLANE_BODY_IDLE_SECONDS`` is given up (408), a client that goes away stops the work.
- The files are the runtime's (``runtime.volume_files``), which resolves every path inside
  the volume (``e2bfacade.runtime.local.storage.volume_files``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections

from e2bfacade.errors import ApiError
from e2bfacade.runtime.base import FileType, GuestFileError, SandboxRuntimeError
from e2bfacade.runtime.volumes import VolumeEntry, VolumeFiles, VolumeNotFound, volumes_of
from nodes.selectors import local_runtime, node_for_volume_id
from sandboxes.dataplane import streams
from sandboxes.dataplane.files import (
    PROGRESS,
    BodyCut,
    BodyStopped,
    _drain,
    query_of,
    receive_body,
    respond,
    send_body,
)
from sandboxes.dataplane.target import StreamCut, header

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

PREFIX = "/volumecontent/"
ROUTE = re.compile(r"/volumecontent/(?P<id>[^/]+)/(?P<what>file|path|dir)")
METHODS = {"file": ("GET", "PUT"), "path": ("GET", "PATCH", "DELETE"), "dir": ("GET", "POST")}
CHUNK = 1 << 20  # a download's read size (E2B's)
BODY_WINDOW = 16  # upload chunks in flight between the loop and the writing thread
PATCH_MAX = 64 << 10  # a PATCH body is three integers
MAX_DEPTH = 10
UINT32 = 0xFFFFFFFF
UNAUTHORIZED = "invalid or missing volume token"
TYPES = {
    FileType.FILE: "file",
    FileType.DIRECTORY: "directory",
    FileType.SYMLINK: "symlink",
    FileType.OTHER: "unknown",
}


class ContentError(Exception):
    def __init__(
        self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = list(headers)


def error_body(status: int, message: str) -> bytes:
    return json.dumps({"code": str(status), "message": message}).encode()


STATUS_OF_ERRNO = {
    errno.ENOENT: 404,
    errno.EEXIST: 409,
    errno.ENOTEMPTY: 409,
    errno.EISDIR: 400,
    errno.ENOTDIR: 400,
    errno.EINVAL: 400,
    errno.ENAMETOOLONG: 400,
    errno.ELOOP: 400,
    errno.EXDEV: 400,
    errno.EBUSY: 400,
    errno.EOPNOTSUPP: 400,
    errno.E2BIG: 400,
    errno.EMLINK: 400,
    errno.EACCES: 403,
    errno.EPERM: 403,
    errno.EROFS: 403,
    errno.ENOSPC: 507,
    errno.EDQUOT: 507,
    errno.EFBIG: 507,
}


def content_error(exc: SandboxRuntimeError, path: str) -> ContentError:
    if isinstance(exc, VolumeNotFound):
        return ContentError(503, f"the volume's storage is not available on this host: {exc}")
    if not isinstance(exc, GuestFileError):
        return ContentError(503, f"the volume could not be reached: {exc}")
    status = STATUS_OF_ERRNO.get(exc.errno, 500)
    if status == 404:
        return ContentError(404, f"path '{path}' not found")
    if status == 409 and exc.errno == errno.EEXIST:
        return ContentError(409, f"path '{path}' already exists")
    if status == 507:
        return ContentError(507, f"not enough space in the volume to write '{path}'")
    if status == 500:
        return ContentError(500, f"the volume's file system failed: {exc}")
    return ContentError(status, str(exc))


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


def entry_json(entry: VolumeEntry) -> dict[str, Any]:
    """E2B's ``VolumeEntryStat``: every field but ``target`` (a symlink's) always there."""
    out: dict[str, Any] = {
        "name": entry.name,
        "type": TYPES.get(entry.type, "unknown"),
        "path": entry.path,
        "size": entry.size,
        "mode": entry.mode,
        "uid": entry.uid,
        "gid": entry.gid,
        "atime": _time(entry.atime),
        "mtime": _time(entry.mtime),
        "ctime": _time(entry.ctime),
    }
    if entry.target is not None:
        out["target"] = entry.target
    return out


# ------------------------------------------------------------------------ parameters
def _uint(query: dict[str, str], name: str) -> int | None:
    value = query.get(name)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 10 or int(value) > UINT32:
        raise ContentError(400, f"{name} must be an unsigned 32-bit integer, not {value[:40]!r}")
    return int(value)


def _bool(query: dict[str, str], name: str) -> bool:
    value = query.get(name)
    if value is None:
        return False
    lowered = value.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ContentError(400, f"{name} must be true or false, not {value[:40]!r}")


def _path(query: dict[str, str]) -> str:
    path = query.get("path")
    if not path:
        raise ContentError(400, "the query parameter 'path' is required")
    if "\0" in path:
        raise ContentError(400, "a path may not contain a NUL byte")
    return path


def _depth(query: dict[str, str]) -> int:
    depth = _uint(query, "depth")
    depth = 1 if depth is None else max(depth, 1)  # as E2B: 0 is 1
    if depth > MAX_DEPTH:
        raise ContentError(400, f"depth must be between 1 and {MAX_DEPTH}")
    return depth


def _patch_fields(body: bytes) -> dict[str, int | None]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ContentError(400, "the body must be a JSON object {uid?, gid?, mode?}") from None
    if not isinstance(data, dict):
        raise ContentError(400, "the body must be a JSON object {uid?, gid?, mode?}")
    out: dict[str, int | None] = {}
    for name in ("uid", "gid", "mode"):
        value = data.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT32
        ):
            raise ContentError(400, f"{name} must be an unsigned 32-bit integer")
        out[name] = value
    return out


# ------------------------------------------------------------------------ the volume
def _row(volume_id: uuid.UUID) -> tuple[int, str, str, int] | None:
    """(team id, state, host, token epoch) of the volume's row, on a thread."""
    from sandboxes.models import Volume

    try:
        return (
            Volume.objects.filter(volume_id=volume_id)
            .values_list("team_id", "state", "host", "token_epoch")
            .first()
        )
    except DatabaseError:
        raise ContentError(503, "the database did not answer: try again") from None
    finally:
        close_old_connections()


def _check_node(volume_id: uuid.UUID, host: str) -> None:
    """The volume's node is this one, or the seam's 503 (:mod:`nodes.selectors`) in this
    API's error shape: the same status, message and ``Should-Retry`` as the control plane."""
    try:
        node_for_volume_id(volume_id, host)
    except ApiError as exc:
        headers = tuple((k.lower().encode(), v.encode()) for k, v in exc.headers.items())
        raise ContentError(exc.status, exc.message, headers) from None


def _files(volume_id: str) -> VolumeFiles:
    runtime = volumes_of(local_runtime())  # the volume's node is this one (_check_node)
    if runtime is None:
        raise ContentError(501, "this host's runtime has no volumes")
    return runtime.volume_files(volume_id)


async def _volume(scope: Scope, volume_text: str) -> tuple[int, uuid.UUID]:
    """The volume the request may reach (its team, its id), or a ContentError: 401 for
    every way a token can fail, the volume's existence included."""
    from sandboxes.models import Volume
    from sandboxes.volumes import tokens

    given = header(scope.get("headers", []), b"authorization") or ""
    scheme, _, token = given.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(tokens.PREFIX) or len(token) > 256:
        raise ContentError(401, UNAUTHORIZED)
    try:
        volume_id = uuid.UUID(volume_text)
    except ValueError:
        raise ContentError(401, UNAUTHORIZED) from None
    row = await streams.call(_row, volume_id)
    if row is None:
        raise ContentError(401, UNAUTHORIZED)
    team_id, state, host, epoch = row
    if not tokens.verify(token, volume_id, epoch):
        raise ContentError(401, UNAUTHORIZED)
    if state == Volume.State.DELETING:
        raise ContentError(409, f"volume {volume_id} is being deleted")
    if state != Volume.State.READY:
        raise ContentError(409, f"volume {volume_id} is not ready yet: try again shortly")
    await streams.call(_check_node, volume_id, host)
    return team_id, volume_id


# ------------------------------------------------------------------------ serving
async def content(scope: Scope, receive: Receive, send: Send) -> None:
    """A request whose path starts with ``/volumecontent/``: no sandbox is involved."""
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1008})
        return
    method = scope.get("method", "")
    try:
        try:
            match = ROUTE.fullmatch(scope.get("path", ""))
            if match is None:
                raise ContentError(404, f"no route for {method} {scope.get('path', '')}")
            allowed = METHODS[match["what"]]
            if method not in allowed:
                raise ContentError(
                    405,
                    f"method {method} is not allowed on {match['what']}",
                    ((b"allow", ", ".join(allowed).encode()),),
                )
            team_id, volume_id = await _volume(scope, match["id"])
        except ContentError:
            await _drain(receive)
            raise
        # From here every thread is the volume's and its team's (with its sandboxes): even
        # the storage's lookup, which may wait for a create or delete of the volume.
        shared = streams.share(streams.Share(f"volume:{volume_id}", f"team:{team_id}"))
        try:
            try:
                files = await _call("/", _files, str(volume_id))
            except ContentError:
                await _drain(receive)
                raise
            await _route(scope, receive, send, files, match["what"], method)
        finally:
            streams.unshare(shared)
    except streams.Busy as exc:
        await _drain(receive)
        await respond(send, 429, error_body(429, exc.message))
    except ContentError as exc:
        await _answer(send, exc)
    except StreamCut as cut:
        if not cut.reset:
            raise  # only the server can drop this connection
        # Expected (the client stopped reading, or the file could not be read on): the
        # client has seen the reset, and there is nothing to report but the reason.
        log.info("data plane: cut a volume content stream: %s", cut)


async def _answer(send: Send, exc: ContentError) -> None:
    body = error_body(exc.status, exc.message)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *exc.headers,
    ]
    if exc.status == 408:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, data: object) -> None:
    await respond(send, status, json.dumps(data).encode())


async def _call(path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await streams.call(fn, *args, **kwargs)
    except SandboxRuntimeError as exc:
        raise content_error(exc, path) from None


async def _route(
    scope: Scope, receive: Receive, send: Send, files: VolumeFiles, what: str, method: str
) -> None:
    query = query_of(scope)
    if method in ("PUT", "PATCH", "POST"):
        try:
            path = _path(query)
        except ContentError:
            await _drain(receive)
            raise
    else:
        path = _path(query)
    if what == "file" and method == "GET":
        await _download(scope, receive, send, files, path)
    elif what == "file":
        try:
            uid, gid, mode, force = (
                _uint(query, "uid"),
                _uint(query, "gid"),
                _uint(query, "mode"),
                _bool(query, "force"),
            )
            encoding = (header(scope.get("headers", []), b"content-encoding") or "identity").lower()
            if encoding != "identity":
                raise ContentError(400, f"content encoding '{encoding}' is not supported")
        except ContentError:
            await _drain(receive)
            raise
        entry = await _upload(scope, receive, files, path, uid, gid, mode, force)
        await _json(send, 201, entry_json(entry))
    elif what == "path" and method == "GET":
        await _json(send, 200, entry_json(await _call(path, files.stat, path)))
    elif what == "path" and method == "PATCH":
        fields = _patch_fields(await _small_body(receive))
        entry = await _call(path, files.update, path, **fields)
        await _json(send, 200, entry_json(entry))
    elif what == "path":
        await _call(path, files.remove, path)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    elif method == "GET":
        depth = _depth(query)
        entries = await _call(path, files.list_dir, path, depth)
        await _json(send, 200, [entry_json(e) for e in entries])
    else:
        uid, gid, mode, force = (
            _uint(query, "uid"),
            _uint(query, "gid"),
            _uint(query, "mode"),
            _bool(query, "force"),
        )
        entry = await _call(path, files.make_dir, path, uid=uid, gid=gid, mode=mode, force=force)
        await _json(send, 201, entry_json(entry))


async def _small_body(receive: Receive) -> bytes:
    idle = settings.DATAPLANE_BODY_IDLE_SECONDS
    body = b""
    more = True
    while more:
        try:
            message = await asyncio.wait_for(receive(), idle)
        except TimeoutError:
            raise ContentError(408, f"the request body did not arrive in {idle:g}s") from None
        if message["type"] == "http.disconnect":
            raise ContentError(400, "the client went away before the body ended")
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if len(body) > PATCH_MAX:
            await _drain(receive)
            raise ContentError(413, f"the body may hold at most {PATCH_MAX} bytes")
    return body


async def _download(
    scope: Scope, receive: Receive, send: Send, files: VolumeFiles, path: str
) -> None:
    """As ``/files`` downloads: each chunk is read on a thread of the share and sent from
    the loop, so no thread waits on the client; a chunk the client does not take within
    ``DATAPLANE_BODY_IDLE_SECONDS`` cuts the connection, and a client that went away ends
    the reading (a huge, or sparse, file is never read to its end for no one)."""
    reader = await _call(path, files.read_file, path, CHUNK)
    headers = [(b"content-type", b"application/octet-stream")]
    await send_body(scope, receive, send, reader, headers, lambda exc: content_error(exc, path))


async def _upload(
    scope: Scope,
    receive: Receive,
    files: VolumeFiles,
    path: str,
    uid: int | None,
    gid: int | None,
    mode: int | None,
    force: bool,
) -> VolumeEntry:
    """The body is received in the loop and handed to the writing thread (a thread of the
    share, held for the upload) without a thread of its own; the file is put in place only
    once the body is complete. A body that moves less than ``PROGRESS`` bytes in
    ``DATAPLANE_BODY_IDLE_SECONDS`` is given up (408); a client that goes away leaves the
    old file as it was."""

    def write(body: streams.Feed) -> VolumeEntry:
        try:
            return files.write_file(path, body, uid=uid, gid=gid, mode=mode, force=force)
        except SandboxRuntimeError as exc:
            raise content_error(exc, path) from None

    async with streams.slot():
        try:
            return await receive_body(receive, write, window=BODY_WINDOW)
        except BodyStopped as exc:
            raise _stopped(exc.idle) from None
        except BodyCut:
            raise ContentError(400, "the client went away before the body ended") from None
        except streams.Aborted as exc:
            raise ContentError(400, exc.message) from None


def _stopped(idle: float) -> ContentError:
    return ContentError(408, f"the request body sent less than {PROGRESS} bytes in {idle:g}s")
