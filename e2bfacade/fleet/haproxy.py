"""The front's routing map, kept in HAProxy through its run-time API (its admin socket).

HAProxy routes a sandbox's requests by a map of ``sandbox id -> host``
(``use_backend %[var(txn.sid),map(<file>)]-api``, docs/fleet.md). The map is changed at run
time, without a reload; entries changed that way are lost on a reload, so the map's file is
rewritten too, and a reload reads it. A full replacement is atomic (``prepare map``, the
entries added to the new version, ``commit map``): a request sees the old map or the new
one, never half of it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path

CHUNK = 5000  # entries per command when a map is replaced: each command is one connection
# Keys and values are sandbox ids and host names: nothing that could split a map's line or
# a command (whitespace, a ';' or a '#').
TOKEN = re.compile(r"^[A-Za-z0-9._:-]{1,255}$")


class FrontError(Exception):
    """HAProxy refused a command, or its socket did not answer."""


def _check(*tokens: str) -> None:
    for token in tokens:
        if not TOKEN.match(token):
            raise ValueError(f"{token!r} cannot be a key or value of the front's map")


class Front:
    """One HAProxy's admin socket (``stats socket … level admin``) and a map it routes by."""

    def __init__(self, socket_path: Path, map_path: Path, timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self.map_path = map_path
        self.timeout = timeout

    def command(self, text: str) -> str:
        """Send one command (or one command with its payload) and return the answer as it
        is (``show stat``, ``show servers state``, …)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(self.timeout)
            try:
                conn.connect(str(self.socket_path))
                conn.sendall(text.encode())
                conn.shutdown(socket.SHUT_WR)
                chunks = []
                while chunk := conn.recv(65536):
                    chunks.append(chunk)
            except OSError as exc:
                raise FrontError(f"HAProxy's socket {self.socket_path}: {exc}") from None
        return b"".join(chunks).decode(errors="replace")

    def _map(self, text: str) -> str:
        """A map command: its answer is empty, a new version, or entries; anything else is
        HAProxy refusing it."""
        answer = self.command(text)
        first = answer.strip().splitlines()[0] if answer.strip() else ""
        if first and not first.startswith(("0x", "New version created")):
            raise FrontError(f"HAProxy refused {text.split(' ', 3)[:3]}: {first}")
        return answer

    def entries(self) -> dict[str, str]:
        """The map as HAProxy routes by it now."""
        out = {}
        for line in self._map(f"show map {self.map_path}\n").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].startswith("0x"):
                out[parts[1]] = parts[2]
        return out

    def replace(self, entries: Mapping[str, str]) -> None:
        """Make the map exactly ``entries``, in one step for the requests routed by it, and
        write its file (what a reload reads)."""
        for key, value in entries.items():
            _check(key, value)
        answer = self._map(f"prepare map {self.map_path}\n")
        version = answer.strip().rsplit(" ", 1)[-1]
        if not version.isdigit():
            raise FrontError(f"HAProxy did not give a map version: {answer.strip()!r}")
        items = sorted(entries.items())
        for start in range(0, len(items), CHUNK):
            payload = "".join(f"{k} {v}\n" for k, v in items[start : start + CHUNK])
            self._map(f"add map @{version} {self.map_path} <<\n{payload}\n")
        self._map(f"commit map @{version} {self.map_path}\n")
        self.write_file(entries)

    def update(self, changed: Mapping[str, str], removed: Iterable[str]) -> None:
        """Route ``changed`` keys to their new values and drop ``removed`` ones, at run time
        (the file is the caller's to rewrite: ``write_file``)."""
        for key, value in changed.items():
            _check(key, value)
            try:
                self._map(f"set map {self.map_path} {key} {value}\n")
            except FrontError:
                # Not there yet ("entry not found"): added. Two keys never race here, as
                # one syncer owns the map.
                self._map(f"add map {self.map_path} {key} {value}\n")
        for key in removed:
            _check(key)
            try:
                self._map(f"del map {self.map_path} {key}\n")
            except FrontError:
                pass  # already gone

    def write_file(self, entries: Mapping[str, str]) -> None:
        tmp = self.map_path.with_name(f".{self.map_path.name}.{os.getpid()}")
        tmp.write_text("".join(f"{k} {v}\n" for k, v in sorted(entries.items())))
        os.replace(tmp, self.map_path)
