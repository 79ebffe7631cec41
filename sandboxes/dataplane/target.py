"""Which sandbox (and which port in it) a data-plane request is for, whether it may reach
it, and the answers E2B's proxy gives when it may not (the SDKs match their wording)."""

from __future__ import annotations

import base64
import contextvars
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any, NoReturn

from e2bfacade.runtime.base import SandboxInfo
from e2bfacade.runtime.guest import Guest

ENVD_PORT = 49983
# The sandbox id as the SDK puts it in a host name: <port>-<id>.<domain>.
HOST_LABEL = re.compile(r"(?P<port>\d{1,5})-(?P<id>[a-z0-9]{1,63})")
NOT_FOUND = "The sandbox was not found"
PORT_CLOSED = "The sandbox is running but port is not open"
UNAUTHORIZED = (
    "unauthorized access, please provide a valid access token or method signing if supported"
)


@dataclass(frozen=True)
class Target:
    sandbox_id: str
    port: int


@dataclass(frozen=True)
class Caller:
    """The request being served: its sandbox's guest, resolved once for the request (every
    call of the request goes to it), and the guest user it acts as (Basic auth's user name,
    or None for the sandbox's default user)."""

    guest: Guest
    user: str | None

    @property
    def sandbox(self) -> SandboxInfo:
        return self.guest.info


current: contextvars.ContextVar[Caller] = contextvars.ContextVar("dataplane_caller")


@dataclass
class Response:
    """How the response being served must end. ``cut``: the sandbox ended under a stream,
    so the connection is dropped instead of the stream ending with an error message. That
    is what a client sees when envd's VM goes away, and what makes every E2B SDK ask
    /health (502, not found) and report the sandbox as killed (older SDKs probe only after
    a dropped connection, not after an error message)."""

    cut: bool = False


response: contextvars.ContextVar[Response] = contextvars.ContextVar("dataplane_response")


def cutting(scope: dict[str, Any], send: Any, state: Response) -> Any:
    """``send`` for a Connect app: once ``state.cut`` is set, the response's last message
    (the error end message the Connect runtime makes) is not sent, and the connection is
    reset instead (server.H11Protocol's extension; where there is none, raising after the
    response started makes the server close it)."""

    async def guarded(message: dict[str, Any]) -> None:
        last = message["type"] == "http.response.body" and not message.get("more_body", False)
        if state.cut and (last or message["type"] == "http.response.trailers"):
            cut_connection(scope, "the sandbox ended while the stream was open")
        await send(message)

    return guarded


class StreamCut(ConnectionAbortedError):
    """A response cut on purpose (:func:`cut_connection`), ``why`` its reason. ``reset``:
    the connection is reset already, so the exception has nothing left to do and
    ``app.application`` ends the request quietly; without a reset it must reach the
    server, which then drops the connection."""

    def __init__(self, why: str, *, reset: bool) -> None:
        super().__init__(why)
        self.reset = reset


def cut_connection(scope: dict[str, Any], why: str) -> NoReturn:
    """End a response already started as a dead sandbox ends one: a TCP reset (the data
    plane server's ``e2bfacade.reset`` extension, server.H11Protocol), then
    :class:`StreamCut`, which unwinds the request (and makes any server drop a
    connection it could not reset)."""
    reset = scope.get("extensions", {}).get("e2bfacade.reset")
    if reset is not None:
        reset()
    raise StreamCut(why, reset=reset is not None)


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def resolve(headers: list[tuple[bytes, bytes]], domain: str) -> Target | None:
    """Headers first (single-URL mode: ``E2b-Sandbox-Id``, ``E2b-Sandbox-Port``), else
    the host name ``<port>-<id>.<SANDBOX_DOMAIN>``; None when the request names neither."""
    sandbox_id = header(headers, b"e2b-sandbox-id")
    if sandbox_id:
        port = header(headers, b"e2b-sandbox-port") or str(ENVD_PORT)
        return Target(sandbox_id, int(port)) if port.isdigit() and int(port) < 65536 else None
    host = (header(headers, b"host") or "").lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    domain = domain.lower().split(":", 1)[0]
    label, _, rest = name.partition(".")
    match = HOST_LABEL.fullmatch(label)
    if match and rest == domain and int(match["port"]) < 65536:
        return Target(match["id"], int(match["port"]))
    return None


def token_ok(sandbox: SandboxInfo, given: str | None) -> bool:
    """The sandbox's envd access token, compared in constant time (no token: open)."""
    if sandbox.envd_access_token is None:
        return True
    return given is not None and hmac.compare_digest(given, sandbox.envd_access_token)


TRAFFIC_HEADER = "e2b-traffic-access-token"


def traffic_refusal(sandbox: SandboxInfo, given: str | None) -> str | None:
    """Why a call to one of the sandbox's ports (not envd's) is refused, in E2B's proxy's
    words; None when its ports are public or the token is right."""
    expected = sandbox.traffic_access_token
    if expected is None:
        return None
    if given is None:
        return (
            "Sandbox is secured with traffic access token. "
            f"Token header '{TRAFFIC_HEADER}' is missing"
        )
    if not hmac.compare_digest(given.encode(), expected.encode()):
        return (
            "Sandbox is secured with traffic access token. "
            f"Provided token in header '{TRAFFIC_HEADER}' is invalid"
        )
    return None


def basic_user(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The user name of ``Authorization: Basic base64(user:)``; None without one."""
    value = header(headers, b"authorization")
    if not value or not value.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(value[6:].strip(), validate=True).decode()
    except ValueError:
        return ""  # present but unreadable: no such user
    return decoded.partition(":")[0] or None


def json_body(code: int, message: str, **extra: object) -> bytes:
    return json.dumps({**extra, "code": code, "message": message}).encode()
