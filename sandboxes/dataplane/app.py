"""The data plane's ASGI application: finds the sandbox a request is for, checks that the
caller may reach it, and hands the request to envd's services (``process.Process``,
``filesystem.Filesystem``, ``/files``, ``/health``) or to the sandbox's port. Requests under
``/volumecontent/`` are E2B's volume content API, for no sandbox (``volumes``); requests
under ``/templates/uploads/`` are the Template SDK's COPY archives, which the front routes
here so that their bodies stream without nginx spooling them (``template_uploads``).

Run it with ``python manage.py serve`` (all of the service) or, alone, with
``uvicorn sandboxes.dataplane.app:application``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from typing import Any

import django

django.setup()

from connectrpc.code import Code  # noqa: E402
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec  # noqa: E402
from connectrpc.errors import ConnectError  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import DatabaseError, close_old_connections  # noqa: E402
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication  # noqa: E402
from e2b.envd.process.process_connect import ProcessASGIApplication  # noqa: E402

from e2bfacade.errors import ApiError  # noqa: E402
from e2bfacade.runtime.base import (  # noqa: E402
    PauseMode,
    RuntimeConflict,
    SandboxRuntimeError,
    SandboxState,
)
from e2bfacade.runtime.guest import Guest  # noqa: E402
from nodes.selectors import local_runtime, node_for_sandbox_id  # noqa: E402
from sandboxes.dataplane import liveness, streams, template_uploads, volumes  # noqa: E402
from sandboxes.dataplane.files import files, query_of, respond, signature  # noqa: E402
from sandboxes.dataplane.filesystem import FilesystemService  # noqa: E402
from sandboxes.dataplane.ports import forward  # noqa: E402
from sandboxes.dataplane.process import ProcessService  # noqa: E402
from sandboxes.dataplane.target import (  # noqa: E402
    ENVD_PORT,
    NOT_FOUND,
    UNAUTHORIZED,
    Caller,
    Response,
    StreamCut,
    Target,
    basic_user,
    current,
    cut_connection,
    cutting,
    header,
    json_body,
    resolve,
    response,
    token_ok,
    traffic_refusal,
)

log = logging.getLogger(__name__)
Scope = dict[str, Any]
Receive = Any
Send = Any

# Request messages are small (a command line, a path); stdin goes in pieces the SDK sizes.
READ_MAX = 8 << 20
# How long a sandbox woken by a request runs before its timeout action, as a connect would
# give it (the SDK's default timeout).
AUTO_RESUME_SECONDS = 300


class _Strict:
    """A codec whose undecodable message is the caller's error (invalid_argument, 400),
    as connect-go answers it, not an unknown server error (connectrpc's default: 500)."""

    def __init__(self, inner: Codec[Any, Any]) -> None:
        self._inner = inner

    def name(self) -> str:
        return self._inner.name()

    def encode(self, message: object) -> bytes:
        return self._inner.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[object]) -> object:
        try:
            return self._inner.decode(data, message_class)
        except ConnectError:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoding failure is the request's
            raise ConnectError(Code.INVALID_ARGUMENT, f"malformed request message: {exc}") from None


CODECS = [_Strict(proto_json_codec()), _Strict(proto_binary_codec())]
process_app = ProcessASGIApplication(
    ProcessService(),  # type: ignore[arg-type]
    read_max_bytes=READ_MAX,
    codecs=CODECS,
)
filesystem_app = FilesystemASGIApplication(
    FilesystemService(),  # type: ignore[arg-type]
    read_max_bytes=READ_MAX,
    codecs=CODECS,
)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _deny(send: Send, status: int, message: str, **extra: object) -> None:
    await respond(send, status, json_body(status, message, **extra))


def _guest_of(sandbox_id: str) -> Guest | None:
    """The running sandbox's guest, resolved once for the request (the one read of its
    state); None when it does not run. A paused one created with autoResume wakes first,
    as on E2B, if it kept its memory: traffic never cold-boots one that kept only its
    files (E2B refuses that too; connect() does it)."""
    runtime = local_runtime()
    try:
        return runtime.guest(sandbox_id)
    except RuntimeConflict:
        pass  # not running: paused, or dead
    except SandboxRuntimeError:
        return None  # never made, or killed
    try:
        sandbox = runtime.status(sandbox_id)
        if sandbox.state is not SandboxState.PAUSED or sandbox.pause_mode is PauseMode.FILESYSTEM:
            return None
        return runtime.guest(sandbox_id) if _auto_resume(sandbox_id) else None
    except SandboxRuntimeError:
        return None


def _auto_resume(sandbox_id: str) -> bool:
    """Resume a paused sandbox that was created with ``autoResume`` (through the control
    plane's own transition, so the database and the runtime agree); False when it does not
    auto-resume. The only database read of the data plane, and only on this path."""
    from sandboxes.models import Sandbox
    from sandboxes.services import sandbox_connect

    try:
        row = Sandbox.objects.select_related("team").filter(sandbox_id=sandbox_id).first()
        if row is None or not row.auto_resume:
            return False
        try:
            sandbox_connect(team=row.team, sandbox_id=sandbox_id, timeout=AUTO_RESUME_SECONDS)
        except ApiError:
            pass  # another request resumed it first (or it is being killed): look again
        return True
    finally:
        close_old_connections()


def _held_elsewhere(sandbox_id: str) -> ApiError | None:
    """The nodes seam's answer for a sandbox this host's runtime does not have but whose
    row names another host (a 503, as the control plane answers); None otherwise. Read
    only when the runtime missed: a request for a sandbox running here reads no row."""
    from sandboxes.models import Sandbox

    try:
        host = (
            Sandbox.objects.filter(sandbox_id=sandbox_id)
            .exclude(state=Sandbox.State.KILLED)
            .values_list("host", flat=True)
            .first()
        )
        if host is not None:
            node_for_sandbox_id(sandbox_id, host)
    except ApiError as exc:
        return exc
    except DatabaseError:
        log.warning("data plane: cannot read sandbox %s's host (database error)", sandbox_id)
    finally:
        close_old_connections()
    return None


_teams: dict[str, str] = {}  # sandbox id -> its team's share key (a sandbox never moves)
_team_lookups: dict[str, asyncio.Future[str]] = {}
TEAMS_KEPT = 65536


def _team_row(sandbox_id: str) -> str:
    from sandboxes.models import Sandbox

    try:
        team_id = (
            Sandbox.objects.filter(sandbox_id=sandbox_id).values_list("team_id", flat=True).first()
        )
    except DatabaseError:
        log.warning("data plane: no team found for sandbox %s (database error)", sandbox_id)
        return f"sandbox:{sandbox_id}"
    finally:
        close_old_connections()
    if team_id is None:
        return f"sandbox:{sandbox_id}"
    if len(_teams) >= TEAMS_KEPT:
        _teams.clear()
    _teams[sandbox_id] = key = f"team:{team_id}"
    return key


async def _team_of(sandbox_id: str) -> str:
    """The key of the sandbox's team's share (:mod:`.streams`): one indexed read per sandbox
    and worker, however many requests ask at once, then kept. A sandbox the database does
    not hold (or a database that does not answer) makes a team of its own."""
    known = _teams.get(sandbox_id)
    if known is not None:
        return known
    pending = _team_lookups.get(sandbox_id)
    if pending is None:
        pending = asyncio.ensure_future(streams.call(_team_row, sandbox_id))
        _team_lookups[sandbox_id] = pending
        pending.add_done_callback(lambda _: _team_lookups.pop(sandbox_id, None))
    return await asyncio.shield(pending)


def _signed_target(scope: Scope) -> Target | None:
    """The sandbox a signed ``/files`` URL was made for, when it names none: the SDK's
    ``download_url``/``upload_url`` under ``E2B_SANDBOX_URL`` carry no sandbox id, only a
    signature over the sandbox's token, so the token that verifies it names the sandbox.
    (One hash per running sandbox; only for such requests.)"""
    query = query_of(scope)
    given = query.get("signature")
    if not given:
        return None
    operation = "read" if scope.get("method") == "GET" else "write"
    path, user = query.get("path", ""), query.get("username", "")
    for info in local_runtime().list():
        token = info.envd_access_token
        if token and hmac.compare_digest(
            given, signature(path, operation, user, token, query.get("signature_expiration"))
        ):
            return Target(info.sandbox_id, ENVD_PORT)
    return None


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope.get("path", "").startswith(template_uploads.PREFIX):
        # The Template SDK's COPY archives, routed here by the front: for no sandbox.
        await template_uploads.upload(scope, receive, send)
        return
    if scope.get("path", "").startswith(volumes.PREFIX):
        # E2B's volume content API: a volume's token, no sandbox (sandboxes/dataplane/volumes).
        await volumes.content(scope, receive, send)
        return
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    target = resolve(headers, settings.SANDBOX_DOMAIN)
    if scope["type"] == "websocket":
        if target is None or target.port == ENVD_PORT:
            await send({"type": "websocket.close", "code": 1008})
            return
    if target is None and scope.get("path") == "/files" and scope["type"] == "http":
        target = await streams.call(_signed_target, scope)
    if target is None:
        await _deny(
            send,
            400,
            "no sandbox named: send E2b-Sandbox-Id (and E2b-Sandbox-Port), or use the host "
            f"name <port>-<sandboxID>.{settings.SANDBOX_DOMAIN}",
        )
        return
    guest = await streams.call(_guest_of, target.sandbox_id)
    if guest is None and (elsewhere := await streams.call(_held_elsewhere, target.sandbox_id)):
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1011})
            return
        body = json_body(
            elsewhere.status,
            elsewhere.message,
            sandboxId=target.sandbox_id,
            error_code=elsewhere.error_code,
        )
        await send(
            {
                "type": "http.response.start",
                "status": elsewhere.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *((k.lower().encode(), v.encode()) for k, v in elsewhere.headers.items()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return
    if guest is None:
        # Killed, never made, or paused (no auto-resume): as E2B's proxy answers.
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1011})
            return
        await _deny(send, 502, NOT_FOUND, sandboxId=target.sandbox_id)
        return
    team = await _team_of(guest.sandbox_id)
    shared = streams.share(streams.Share(guest.sandbox_id, team))
    state = Response()
    try:
        with liveness.watched(guest, state) as watch:
            try:
                await _serve(scope, receive, send, guest, target, state)
            except asyncio.CancelledError:
                if not watch.cut:
                    raise
                # Cancelled by the watch: the sandbox stopped running under the request.
                # (A Connect stream ends through its cut response instead: target.cutting.)
                await _cut(scope, send, guest.sandbox_id)
            finally:
                if watch.cut:
                    watch.task.uncancel()
    except StreamCut as cut:
        if not cut.reset:
            raise  # only the server can drop this connection
        # Expected (the sandbox ended under the stream, or the client stopped reading):
        # the client has seen the reset, and there is nothing to report but the reason.
        log.info("data plane: cut a stream of sandbox %s: %s", guest.sandbox_id, cut)
    finally:
        streams.unshare(shared)


async def _cut(scope: Scope, send: Send, sandbox_id: str) -> None:
    """End the request of a sandbox that stopped running: a WebSocket is closed as when
    the guest's side drops (1006, ports.py), anything else is cut (StreamCut)."""
    if scope["type"] == "websocket":
        with contextlib.suppress(Exception):  # it may be closed already
            await send({"type": "websocket.close", "code": 1006})
        log.info("data plane: cut a stream of sandbox %s: %s", sandbox_id, liveness.ENDED)
        return
    cut_connection(scope, liveness.ENDED)


async def _serve(
    scope: Scope, receive: Receive, send: Send, guest: Guest, target: Target, state: Response
) -> None:
    """The request, for a running sandbox, within its share of the threads; ``state``
    says how its response must end (target.Response)."""
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    sandbox = guest.info
    if target.port != ENVD_PORT:
        refused = traffic_refusal(sandbox, header(headers, b"e2b-traffic-access-token"))
        if refused is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await _deny(send, 403, refused, sandboxId=sandbox.sandbox_id)
            return
        await forward(scope, receive, send, guest, target.port)
        return
    path = scope.get("path", "")
    if path == "/health":
        await send(
            {
                "type": "http.response.start",
                "status": 204,
                "headers": [(b"cache-control", b"no-store")],
            }
        )
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/files":
        # The user of /files is its ``username`` parameter (which a signed URL's signature
        # covers), never the Authorization header: files.files_user.
        await files(scope, receive, send, Caller(guest, None))
        return
    caller = Caller(guest, basic_user(headers))
    if not token_ok(sandbox, header(headers, b"x-access-token")):
        await _deny(send, 401, UNAUTHORIZED)
        return
    if caller.user == "":
        await _deny(send, 401, "invalid username")
        return
    token = current.set(caller)
    response_token = response.set(state)
    try:
        if path.startswith("/process.Process/"):
            await process_app(scope, receive, cutting(scope, send, state))  # type: ignore[arg-type]
        elif path.startswith("/filesystem.Filesystem/"):
            await filesystem_app(scope, receive, cutting(scope, send, state))  # type: ignore[arg-type]
        else:
            await _deny(send, 404, f"no route for {scope.get('method')} {path}")
    finally:
        response.reset(response_token)
        current.reset(token)
