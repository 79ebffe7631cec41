"""Helpers for the template-build contract tests: the raw Template SDK v2 protocol (request,
files link, upload, trigger, status) as the SDK speaks it, and tar archives built by hand
(the SDK refuses ``..`` and makes only what a file tree holds)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
import uuid
from typing import Any
from urllib.parse import quote

import httpx

from tests.support.waiting import eventually

TERMINAL = ("ready", "error")
# The one template name the raw-protocol modules make their never-started builds under: each
# new request supersedes the waiting build before it, so at most one is left waiting (a
# waiting build counts against the team's concurrent builds until it ends).
SCRATCH = f"scratch-{uuid.uuid4().hex[:10]}"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def q(ref: str) -> str:
    """A template id in a path, as the Python SDK sends it (``:`` and ``/`` encoded)."""
    return quote(ref, safe="")


def tar_of(*members: tuple[str, str, bytes | str]) -> bytes:
    """A tar of ``(kind, name, data)`` members in that order: kind ``file`` (data: the
    content), ``dir``, or ``symlink`` (data: the target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = int(time.time())
            if kind == "file":
                raw = data.encode() if isinstance(data, str) else data
                info.size, info.mode = len(raw), 0o644
                tar.addfile(info, io.BytesIO(raw))
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
    return buf.getvalue()


def files_hash(data: bytes) -> str:
    """A hash of E2B's shape (64 hex digits), unique to this archive and this run."""
    return hashlib.sha256(data + os.urandom(8)).hexdigest()


def request_build(http: httpx.Client, name: str, **body: Any) -> dict[str, Any]:
    r = http.post("/v3/templates", json={"name": name, "cpuCount": 1, "memoryMB": 512, **body})
    assert r.status_code == 202, r.text
    return dict(r.json())


def file_link(http: httpx.Client, template_id: str, digest: str) -> dict[str, Any]:
    r = http.get(f"/templates/{q(template_id)}/files/{digest}")
    assert r.status_code == 201, r.text
    return dict(r.json())


def upload(http: httpx.Client, template_id: str, data: bytes) -> str:
    """Upload ``data`` as a COPY archive the way the SDK does; returns its files hash."""
    digest = files_hash(data)
    link = file_link(http, template_id, digest)
    put = httpx.put(link["url"], content=data, headers=link["headers"], timeout=30)
    assert put.status_code // 100 == 2, put.text
    return digest


def trigger(
    http: httpx.Client, template_id: str, build_id: str, body: dict[str, Any]
) -> httpx.Response:
    return http.post(f"/v2/templates/{q(template_id)}/builds/{build_id}", json=body)


def base_spec(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"fromTemplate": "base", "force": False, "steps": list(steps), **extra}


def run_step(cmd: str, user: str = "root") -> dict[str, Any]:
    return {"type": "RUN", "args": [cmd, user], "force": False}


def copy_step(digest: str, src: str, dest: str, user: str = "") -> dict[str, Any]:
    return {"type": "COPY", "args": [src, dest, user, ""], "filesHash": digest, "force": False}


def status(http: httpx.Client, template_id: str, build_id: str, **params: Any) -> httpx.Response:
    return http.get(f"/templates/{q(template_id)}/builds/{build_id}/status", params=params)


def wait_build(
    http: httpx.Client, template_id: str, build_id: str, timeout: float = 180
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Poll until the build ends (as the SDK does, paging the log); returns the terminal
    status and every log entry."""
    entries: list[dict[str, Any]] = []

    def ended() -> dict[str, Any] | None:
        """The terminal status once the build has ended and its log is read to the end."""
        while True:  # page on while there is more log
            r = status(http, template_id, build_id, logsOffset=len(entries), limit=100)
            assert r.status_code == 200, r.text
            info: dict[str, Any] = r.json()
            entries.extend(info["logEntries"])
            if not info["logEntries"]:
                return info if info["status"] in TERMINAL else None

    info = eventually(ended, within=timeout, every=0.2, what=f"build {build_id} to end")
    assert info is not None  # eventually returns a value that holds
    return info, entries


def build_raw(
    http: httpx.Client, name: str, spec: dict[str, Any], timeout: float = 180
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Request, trigger and wait: (the request's answer, the terminal status, the log)."""
    made = request_build(http, name)
    r = trigger(http, made["templateID"], made["buildID"], spec)
    assert r.status_code == 202, r.text
    info, log = wait_build(http, made["templateID"], made["buildID"], timeout)
    return made, info, log


def messages(log: list[dict[str, Any]]) -> str:
    return "\n".join(e["message"] for e in log)
