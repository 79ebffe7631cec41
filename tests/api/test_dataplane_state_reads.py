"""The data plane resolves one guest per request: whatever a request does in the sandbox (a
command and the stat of its working directory, a symlink followed, a file streamed), the
sandbox's state is read once, when the request finds it. Each request goes through the data
plane's own ASGI application, in this process, against the real local runtime; what is
counted is every load of a sandbox record from disk (``Layout.read_state``, and the census's
cached reads)."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from e2bfacade.runtime.base import ProcessSpec, SandboxSpec
from e2bfacade.runtime.guest import run_process
from e2bfacade.runtime.local import LocalRuntime
from e2bfacade.runtime.local.state import Layout

TOKEN = "state-reads-token"


@pytest.fixture
def sandbox_id(runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch) -> str:
    from sandboxes.dataplane import app

    sid = f"reads{uuid.uuid4().hex[:12]}"
    # Its team already known: the data plane's database read (not a state read) would be
    # made on its thread pool, whose connections would outlive the test database.
    monkeypatch.setitem(app._teams, sid, f"sandbox:{sid}")
    runtime.create(SandboxSpec(sid, "base", envd_access_token=TOKEN))
    guest = runtime.guest(sid)
    guest.write_file("/home/user/note.txt", [b"noted\n"])
    guest.make_dir("/home/user/proj")
    return sid


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Loads of a sandbox's record, by sandbox id."""
    counted: Counter[str] = Counter()
    for name in ("read_state", "read_state_cached"):
        original = getattr(Layout, name)

        def counting(self: Layout, sid: str, _original: Callable[..., Any] = original) -> Any:
            counted[sid] += 1
            return _original(self, sid)

        monkeypatch.setattr(Layout, name, counting)
    yield counted


def envelope(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return b"\0" + struct.pack(">I", len(data)) + data


def messages(body: bytes) -> list[dict[str, Any]]:
    out, at = [], 0
    while at < len(body):
        flags, size = body[at], struct.unpack(">I", body[at + 1 : at + 5])[0]
        message = json.loads(body[at + 5 : at + 5 + size])
        assert not flags & 2 or message == {}, message  # an end message without an error
        out.append(message)
        at += 5 + size
    return out


def serve(sandbox_id: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request to the data plane's application, as the SDK sends it."""
    from sandboxes.dataplane.app import application

    headers = {
        "E2b-Sandbox-Id": sandbox_id,
        "X-Access-Token": TOKEN,
        "Authorization": "Basic " + base64.b64encode(b"user:").decode(),
        **kwargs.pop("headers", {}),
    }

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://dataplane") as c:
            return await c.request(method, path, headers=headers, timeout=30, **kwargs)

    return asyncio.run(send())


def connect(sandbox_id: str, rpc: str, message: dict[str, Any]) -> list[dict[str, Any]]:
    streaming = rpc in ("/process.Process/Start",)
    response = serve(
        sandbox_id,
        "POST",
        rpc,
        content=envelope(message) if streaming else json.dumps(message).encode(),
        headers={
            "Content-Type": "application/connect+json" if streaming else "application/json",
            "Connect-Protocol-Version": "1",
        },
    )
    assert response.status_code == 200, response.text
    return messages(response.content) if streaming else [response.json()]


def test_a_command_reads_its_sandbox_state_once(sandbox_id: str, reads: Counter[str]) -> None:
    events = connect(
        sandbox_id,
        "/process.Process/Start",
        {"process": {"cmd": "/bin/sh", "args": ["-c", "pwd"], "cwd": "proj"}},
    )
    out = [e["event"]["data"]["stdout"] for e in events if "data" in e.get("event", {})]
    assert base64.b64decode("".join(out)) == b"/home/user/proj\n"
    assert [e["event"]["end"] for e in events if "end" in e.get("event", {})] == [
        {"exited": True, "status": "exit status 0"}
    ]
    assert reads[sandbox_id] == 1, f"the sandbox's state was read {reads[sandbox_id]} times"


def test_a_file_read_reads_its_sandbox_state_once(sandbox_id: str, reads: Counter[str]) -> None:
    response = serve(sandbox_id, "GET", "/files", params={"path": "note.txt"})
    assert response.status_code == 200, response.text
    assert response.content == b"noted\n"
    assert reads[sandbox_id] == 1, f"the sandbox's state was read {reads[sandbox_id]} times"


def test_a_file_write_reads_its_sandbox_state_once(sandbox_id: str, reads: Counter[str]) -> None:
    response = serve(
        sandbox_id,
        "POST",
        "/files",
        params={"path": "proj/up.txt"},
        content=b"uploaded\n",
        headers={"Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    assert [f["path"] for f in response.json()] == ["/home/user/proj/up.txt"]
    assert reads[sandbox_id] == 1, f"the sandbox's state was read {reads[sandbox_id]} times"


def test_a_listing_through_a_symlink_reads_its_sandbox_state_once(
    runtime: LocalRuntime, sandbox_id: str, reads: Counter[str]
) -> None:
    guest = runtime.guest(sandbox_id)
    guest.write_file("proj/a.txt", [b"a"])
    made = run_process(guest, ProcessSpec(("ln", "-s", "proj", "/home/user/link")))
    assert made.exit_code == 0, made
    reads.clear()  # the guest above read it: only the request's reads count
    [listing] = connect(sandbox_id, "/filesystem.Filesystem/ListDir", {"path": "link"})
    assert [e["path"] for e in listing["entries"]] == ["/home/user/link/a.txt"]
    assert reads[sandbox_id] == 1, f"the sandbox's state was read {reads[sandbox_id]} times"
