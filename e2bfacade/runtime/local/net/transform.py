"""Transform rules (E2B's ``network.rules``): the headers the egress proxy writes into a
sandbox's HTTP requests to a rule's domain, their placeholders resolved on the way out.

Pure functions over bytes, no I/O (egress.py does the reading and writing): parse one
HTTP/1.x request head, find a request's body framing, rewrite its headers, and mask the
values written into a request in what is relayed back.

A header value may hold placeholders, ``${e2b.secrets.<name>}``: each is replaced by what
the proxy's resolver answers for it. A header with a placeholder the resolver cannot
resolve (an unknown or revoked secret) is dropped, never sent with the placeholder's text
in it (which names the secret) — and neither is the sandbox's own header of that name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

PLACEHOLDER = re.compile(r"\$\{e2b\.(secrets|identity\.tokens)\.([^}]*)\}")
SECRET_KIND = "secrets"
TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token: a header name
HOP = (b"connection", b"keep-alive", b"proxy-connection", b"upgrade", b"te")


class BadRequest(ValueError):
    """A request the proxy will not rewrite (malformed, ambiguous framing): the connection
    is closed, nothing of it forwarded."""


@dataclass(frozen=True)
class Request:
    """One request's head: the request line and its header lines in order (names as sent)."""

    line: bytes
    headers: list[tuple[bytes, bytes]]

    def get(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name]

    def host(self) -> str | None:
        hosts = self.get(b"host")
        if len(hosts) != 1:
            return None  # none, or two that could disagree: not this rule's request
        host = hosts[0].decode("ascii", errors="replace").strip()
        if host.startswith("["):
            return None
        return (host.rsplit(":", 1)[0] if ":" in host else host).lower().rstrip(".")


def placeholders(value: str) -> list[tuple[str, str]]:
    """The (kind, name) of every placeholder in ``value``: kind ``secrets`` or
    ``identity.tokens``."""
    return [(m.group(1), m.group(2)) for m in PLACEHOLDER.finditer(value)]


def rule_for(name: str | None, rules: dict[str, dict[str, str]]) -> dict[str, str] | None:
    """The headers of the rules whose domain matches ``name`` (``example.com`` exactly,
    ``*.example.com`` the names below it, ``*`` any), merged in the rules' order; None when
    none matches."""
    if not name:
        return None
    name = name.lower().rstrip(".")
    found: dict[str, str] | None = None
    for domain, headers in rules.items():
        if (
            domain == "*"
            or name == domain
            or (domain.startswith("*.") and name.endswith(domain[1:]))
        ):
            found = {**(found or {}), **headers}
    return found


def parse_head(head: bytes) -> Request:
    """The request of ``head`` (up to and without its blank line)."""
    lines = head.split(b"\r\n")
    line = lines[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest("not an HTTP/1.x request line")
    headers = []
    for raw in lines[1:]:
        key, sep, value = raw.partition(b":")
        if not sep or not TOKEN.fullmatch(key):
            raise BadRequest("a malformed header line")  # folded lines included
        headers.append((key, value.strip(b" \t")))
    return Request(line, headers)


def body_framing(request: Request) -> int | None:
    """The body's length in bytes; None: chunked. Ambiguous framing (both, several
    lengths, a coding other than chunked) is refused: a request the proxy and the
    destination would split differently could carry a second, unrewritten request."""
    codings = request.get(b"transfer-encoding")
    lengths = request.get(b"content-length")
    if codings:
        if lengths or len(codings) != 1 or codings[0].strip().lower() != b"chunked":
            raise BadRequest("unsupported or ambiguous body framing")
        return None
    if not lengths:
        return 0
    if len(set(lengths)) != 1 or not lengths[0].isdigit():
        raise BadRequest("an invalid Content-Length")
    return int(lengths[0])


def rewrite(
    request: Request, headers: dict[str, str], resolve: Callable[[str, str], str | None]
) -> tuple[bytes, list[bytes]]:
    """The request's head with ``headers`` written in (each replacing the sandbox's own
    headers of that name, in any case), and the resolved values (to mask in what comes
    back). A header whose placeholder does not resolve is dropped, with the sandbox's own
    of that name. ``resolve(kind, name)`` answers a placeholder's value or None."""
    written: list[tuple[bytes, bytes]] = []
    values: list[bytes] = []
    for name, template in headers.items():
        value: str | None = template
        for kind, ref in placeholders(template):
            got = resolve(kind, ref)
            if got is None:
                value = None
                break
            assert value is not None
            value = value.replace(f"${{e2b.{kind}.{ref}}}", got)
            values.append(got.encode())
        if value is not None:
            written.append((name.encode(), value.encode()))
    replaced = {name.lower().encode() for name in headers}
    kept = [(k, v) for k, v in request.headers if k.lower() not in replaced]
    lines = [request.line, *(k + b": " + v for k, v in kept + written)]
    return b"\r\n".join(lines) + b"\r\n\r\n", values


class Masker:
    """Replaces every occurrence of the values written into requests with as many ``*``
    in a stream relayed back (a destination that echoes request headers), keeping the
    stream's length, so the response's framing still holds. A value split across two reads
    is caught: an end of a read that could begin a value is held back until the next read
    (or :meth:`flush`, which the relay calls once the stream pauses). An encoded echo
    (compressed, base64) is not recognised."""

    def __init__(self) -> None:
        self.values: set[bytes] = set()
        self.held = b""

    def add(self, values: list[bytes]) -> None:
        self.values.update(v for v in values if v)

    def feed(self, data: bytes) -> bytes:
        data = self.held + data
        for value in sorted(self.values, key=len, reverse=True):
            data = data.replace(value, b"*" * len(value))
        keep = 0  # the longest end of ``data`` that begins a value
        for value in self.values:
            i = data.find(value[:1], max(0, len(data) - len(value) + 1))
            while i != -1 and len(data) - i > keep:
                if value.startswith(data[i:]):
                    keep = len(data) - i
                    break
                i = data.find(value[:1], i + 1)
        self.held = data[len(data) - keep :]
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        out, self.held = self.held, b""
        return out
