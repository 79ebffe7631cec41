"""Requests for a sandbox port other than envd's, forwarded to what listens on it inside:
HTTP/1.1 both ways streamed (h11 speaks to the guest), WebSocket upgrades relayed message by
message (wsproto). Nothing listening is a 502 with E2B's wording ("port is not open").
A sandbox created with ``allowPublicTraffic: false`` is reached only with its
``e2b-traffic-access-token`` (checked by the caller, app.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import h11
from wsproto import ConnectionType, WSConnection
from wsproto import events as ws

from e2bfacade.runtime.base import SandboxRuntimeError
from e2bfacade.runtime.guest import Guest
from sandboxes.dataplane import streams
from sandboxes.dataplane.files import respond
from sandboxes.dataplane.target import PORT_CLOSED, cut_connection, header, json_body

Scope = dict[str, Any]
Receive = Any
Send = Any
READ = 1 << 16
# Not forwarded: hop-by-hop headers, and what is ours (which sandbox, its tokens).
DROPPED = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"transfer-encoding",
    b"te",
    b"trailer",
    b"upgrade",
    b"e2b-sandbox-id",
    b"e2b-sandbox-port",
    b"e2b-traffic-access-token",
}


async def _open(
    guest: Guest, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    try:
        sock: socket.socket = await streams.call(guest.connect_port, port)
    except SandboxRuntimeError:
        return None
    sock.setblocking(False)
    return await asyncio.open_connection(sock=sock, limit=READ)


# What the guest's side of a connection does when its service dies or its sandbox is killed
# with data in flight: read as the connection's end, which the caller tells apart (a 502
# before the answer began, a cut after).
RESET = (ConnectionResetError, BrokenPipeError)


async def _read(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.read(READ)
    except RESET:
        return b""


def _target(scope: Scope) -> bytes:
    raw: bytes = scope.get("raw_path") or scope.get("path", "/").encode()
    query: bytes = scope.get("query_string", b"")
    return raw + (b"?" + query if query else b"")


def _forwarded_headers(
    scope: Scope, port: int, mask: str | None = None
) -> list[tuple[bytes, bytes]]:
    """The caller's headers, less the hop's; the Host is ``mask`` (E2B's maskRequestHost,
    ``${PORT}`` replaced by the port) when the sandbox was created with one."""
    out = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in DROPPED]
    if mask is not None:
        out = [(k, v) for k, v in out if k.lower() != b"host"]
        # Capitalised as a client sends it: what the sandbox's server records (E2B's test
        # looks for "Host:").
        out.insert(0, (b"Host", mask.replace("${PORT}", str(port)).encode()))
    elif not any(k.lower() == b"host" for k, _ in out):
        out.insert(0, (b"host", f"localhost:{port}".encode()))
    return out


async def forward(scope: Scope, receive: Receive, send: Send, guest: Guest, port: int) -> None:
    if scope["type"] == "websocket":
        await _websocket(scope, receive, send, guest, port)
        return
    opened = await _open(guest, port)
    if opened is None:
        await respond(send, 502, json_body(502, PORT_CLOSED, sandboxId=guest.sandbox_id, port=port))
        return
    reader, writer = opened
    conn = h11.Connection(h11.CLIENT)
    headers = _forwarded_headers(scope, port, guest.info.mask_request_host)
    has_length = any(k.lower() == b"content-length" for k, _ in headers)
    if not has_length and scope["method"] not in ("GET", "HEAD", "OPTIONS", "DELETE"):
        headers.append((b"transfer-encoding", b"chunked"))
    headers.append((b"connection", b"close"))
    writer.write(
        conn.send(h11.Request(method=scope["method"], target=_target(scope), headers=headers))
    )

    client_gone = asyncio.Event()

    async def upload() -> None:
        with contextlib.suppress(*RESET):  # the guest's side went away: the reader sees it
            await _upload()

    async def _upload() -> None:
        sent = False
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # The client hung up: so does the guest's side, as a direct connection
                # would (a streaming service learns it, e.g. the Code Interpreter's
                # execution service interrupts its kernel).
                client_gone.set()
                writer.close()
                return
            body = message.get("body", b"")
            if body and not sent:
                writer.write(conn.send(h11.Data(data=body)))
                await writer.drain()
            if not message.get("more_body", False) and not sent:
                writer.write(conn.send(h11.EndOfMessage()))
                await writer.drain()
                sent = True  # then wait on, for the disconnect (cancelled at the end)

    uploading = asyncio.ensure_future(upload())
    started = complete = False
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await _read(reader)
                conn.receive_data(data)
                if not data and not started:
                    break
                continue
            if isinstance(event, h11.Response):
                started = True
                out = [(k, v) for k, v in event.headers if k.lower() not in DROPPED]
                await send(
                    {"type": "http.response.start", "status": event.status_code, "headers": out}
                )
            elif isinstance(event, h11.Data):
                await send(
                    {"type": "http.response.body", "body": bytes(event.data), "more_body": True}
                )
            elif isinstance(event, h11.EndOfMessage):
                complete = True
                break
            elif isinstance(event, h11.ConnectionClosed):
                break
    except h11.RemoteProtocolError as exc:
        if not started:
            await respond(
                send, 502, json_body(502, f"the sandbox's port {port} answered badly: {exc}")
            )
            return
    finally:
        uploading.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    if not started:
        await respond(
            send, 502, json_body(502, f"the sandbox's port {port} closed without answering")
        )
        return
    if not complete and not client_gone.is_set():
        # Cut off mid-response (the sandbox was killed, its service died): the client must
        # see a cut too, not a response that looks complete, and the same one a stream of
        # envd's gets (target.cut_connection).
        cut_connection(scope, f"the sandbox's port {port} closed in mid-response")
    await send({"type": "http.response.body", "body": b""})


async def _websocket(scope: Scope, receive: Receive, send: Send, sandbox: Guest, port: int) -> None:
    first = await receive()  # websocket.connect
    if first["type"] != "websocket.connect":
        return
    opened = await _open(sandbox, port)
    if opened is None:
        await send({"type": "websocket.close", "code": 1011, "reason": PORT_CLOSED})
        return
    reader, writer = opened
    guest = WSConnection(ConnectionType.CLIENT)
    extra = [
        (k, v)
        for k, v in _forwarded_headers(scope, port)
        if not k.lower().startswith(b"sec-websocket") and k.lower() != b"host"
    ]
    mask = sandbox.info.mask_request_host
    host = (
        mask.replace("${PORT}", str(port))
        if mask is not None
        else header(scope.get("headers", []), b"host") or f"localhost:{port}"
    )
    writer.write(
        guest.send(
            ws.Request(
                host=host,
                target=_target(scope).decode("latin-1"),
                subprotocols=list(scope.get("subprotocols", [])),
                extra_headers=extra,
            )
        )
    )
    accepted = False
    try:
        while not accepted:
            data = await _read(reader)
            if not data:
                await send({"type": "websocket.close", "code": 1011})
                return
            guest.receive_data(data)
            for event in guest.events():
                if isinstance(event, ws.AcceptConnection):
                    await send({"type": "websocket.accept", "subprotocol": event.subprotocol})
                    accepted = True
                elif isinstance(event, ws.RejectConnection):
                    await send({"type": "websocket.close", "code": 1011})
                    return

        async def to_guest() -> None:
            with contextlib.suppress(*RESET):  # the guest's side went away: the reader sees it
                await _to_guest()

        async def _to_guest() -> None:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    writer.write(guest.send(ws.CloseConnection(code=message.get("code", 1000))))
                    await writer.drain()
                    return
                if message.get("text") is not None:
                    writer.write(guest.send(ws.TextMessage(data=message["text"])))
                elif message.get("bytes") is not None:
                    writer.write(guest.send(ws.BytesMessage(data=message["bytes"])))
                await writer.drain()

        upstream = asyncio.ensure_future(to_guest())
        try:
            while True:
                data = await _read(reader)
                guest.receive_data(data or None)
                for event in guest.events():
                    if isinstance(event, ws.TextMessage):
                        await send({"type": "websocket.send", "text": event.data})
                    elif isinstance(event, ws.BytesMessage):
                        await send({"type": "websocket.send", "bytes": bytes(event.data)})
                    elif isinstance(event, ws.Ping):
                        writer.write(guest.send(event.response()))
                    elif isinstance(event, ws.CloseConnection):
                        await send({"type": "websocket.close", "code": event.code})
                        return
                if not data:
                    await send({"type": "websocket.close", "code": 1006})
                    return
        finally:
            upstream.cancel()
    finally:
        writer.close()
