"""The data plane's ASGI application: finds the sandbox a request is for, checks that the
caller may reach it, and hands the request to envd's services (``process.Process``,
``filesystem.Filesystem``, ``/files``, ``/health``) or to the sandbox's port.

Run it with ``python manage.py serve`` (all of the service) or, alone, with
``uvicorn sandboxes.dataplane.app:application``.
"""

from __future__ import annotations

import logging
from typing import Any

import django

django.setup()

from django.conf import settings  # noqa: E402
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication  # noqa: E402
from e2b.envd.process.process_connect import ProcessASGIApplication  # noqa: E402

from e2bfacade.runtime.base import SandboxNotFound, SandboxRuntimeError, SandboxState  # noqa: E402
from e2bfacade.sandbox_runtime import get_runtime  # noqa: E402
from sandboxes.dataplane import streams  # noqa: E402
from sandboxes.dataplane.files import files, respond  # noqa: E402
from sandboxes.dataplane.filesystem import FilesystemService  # noqa: E402
from sandboxes.dataplane.ports import forward  # noqa: E402
from sandboxes.dataplane.process import ProcessService  # noqa: E402
from sandboxes.dataplane.target import (  # noqa: E402
    ENVD_PORT,
    NOT_FOUND,
    UNAUTHORIZED,
    Caller,
    basic_user,
    current,
    header,
    json_body,
    resolve,
    token_ok,
)

log = logging.getLogger(__name__)
Scope = dict[str, Any]
Receive = Any
Send = Any

# Request messages are small (a command line, a path); stdin goes in pieces the SDK sizes.
READ_MAX = 8 << 20
process_app = ProcessASGIApplication(ProcessService(), read_max_bytes=READ_MAX)  # type: ignore[arg-type]
filesystem_app = FilesystemASGIApplication(FilesystemService(), read_max_bytes=READ_MAX)  # type: ignore[arg-type]


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


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    target = resolve(headers, settings.SANDBOX_DOMAIN)
    if scope["type"] == "websocket":
        if target is None or target.port == ENVD_PORT:
            await send({"type": "websocket.close", "code": 1008})
            return
    if target is None:
        await _deny(
            send,
            400,
            "no sandbox named: send E2b-Sandbox-Id (and E2b-Sandbox-Port), or use the host "
            f"name <port>-<sandboxID>.{settings.SANDBOX_DOMAIN}",
        )
        return
    try:
        sandbox = await streams.call(get_runtime().status, target.sandbox_id)
    except (SandboxNotFound, SandboxRuntimeError):
        sandbox = None
    if sandbox is None or sandbox.state is not SandboxState.RUNNING:
        # Killed, never made, or paused (no auto-resume): as E2B's proxy answers.
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1011})
            return
        await _deny(send, 502, NOT_FOUND, sandboxId=target.sandbox_id)
        return
    if target.port != ENVD_PORT:
        await forward(scope, receive, send, sandbox, target.port)
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
    caller = Caller(sandbox, basic_user(headers))
    if path == "/files":
        await files(scope, receive, send, caller)
        return
    if not token_ok(sandbox, header(headers, b"x-access-token")):
        await _deny(send, 401, UNAUTHORIZED)
        return
    if caller.user == "":
        await _deny(send, 401, "invalid username")
        return
    token = current.set(caller)
    try:
        if path.startswith("/process.Process/"):
            await process_app(scope, receive, send)  # type: ignore[arg-type]
        elif path.startswith("/filesystem.Filesystem/"):
            await filesystem_app(scope, receive, send)  # type: ignore[arg-type]
        else:
            await _deny(send, 404, f"no route for {scope.get('method')} {path}")
    finally:
        current.reset(token)
