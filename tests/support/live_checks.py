"""What the black-box suites (tests/retry, tests/faults, tests/fuzz, tests/soak) and
``bench/soak.py`` check on a live e2bfacade started by ``tests/support/live_server.py``:
the error shape on the wire, the server's database and its runtime, and whether the two
agree. No pytest here: the soak script uses it too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx

from tests.support import live_database
from tests.support.live_server import LiveServer

TRANSITIONAL = ("creating", "pausing", "resuming", "killing")
LIVE = ("running", "paused", *TRANSITIONAL)


def error_shape_problem(response: httpx.Response) -> str | None:
    """Why ``response`` (an error) is not in E2B's shape, or None when it is: a JSON object
    whose ``code`` equals the status and whose ``message`` is a string."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{response.status_code} with a non-JSON body: {response.text[:200]!r}"
    if not isinstance(body, dict):
        return f"{response.status_code} with a JSON body that is not an object: {body!r:.200}"
    if body.get("code") != response.status_code:
        return f"{response.status_code} whose body's code is {body.get('code')!r}: {body!r:.200}"
    if not isinstance(body.get("message"), str):
        return f"{response.status_code} without a string message: {body!r:.200}"
    if not response.headers.get("content-type", "").startswith("application/json"):
        return f"{response.status_code} with content type {response.headers.get('content-type')}"
    return None


def assert_error_shape(response: httpx.Response) -> dict[str, Any]:
    problem = error_shape_problem(response)
    assert problem is None, problem
    body: dict[str, Any] = response.json()
    return body


def client(server: LiveServer, *, api_key: str | None = None, timeout: float = 30) -> httpx.Client:
    return httpx.Client(
        base_url=server.url,
        headers={"X-API-Key": api_key or server.api_key},
        timeout=timeout,
    )


# ------------------------------------------------------------------------------ database
def is_postgres(server: LiveServer) -> bool:
    return live_database.is_postgres(server.env["DATABASE_URL"])


def query(server: LiveServer, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on the server's own database (PostgreSQL ``%s`` placeholders)."""
    return live_database.query(server.env["DATABASE_URL"], sql, params)


def db_states(server: LiveServer, *, include_killed: bool = False) -> dict[str, str]:
    """sandbox id -> state, for every team."""
    rows = query(server, "SELECT sandbox_id, state FROM sandboxes_sandbox")
    return {sid: state for sid, state in rows if include_killed or state != "killed"}


def db_row(server: LiveServer, sandbox_id: str) -> tuple[str, Any] | None:
    """(state, end_at) of one sandbox row, or None."""
    rows = query(
        server, "SELECT state, end_at FROM sandboxes_sandbox WHERE sandbox_id = %s", (sandbox_id,)
    )
    return (rows[0][0], rows[0][1]) if rows else None


def tagged_rows(server: LiveServer, tag: str) -> dict[str, str]:
    """id -> state of every sandbox row (killed ones too) whose metadata has ``tag=<tag>``."""
    out = {}
    rows = query(server, "SELECT sandbox_id, state, metadata FROM sandboxes_sandbox")
    for sandbox_id, state, metadata in rows:
        if isinstance(metadata, str):  # SQLite hands JSON back as text
            metadata = json.loads(metadata)
        if (metadata or {}).get("tag") == tag:
            out[sandbox_id] = state
    return out


def template_ids(server: LiveServer) -> set[str]:
    return {r[0] for r in query(server, "SELECT template_id FROM templates_template")}


# ------------------------------------------------------------------------------- runtime
def runtime(server: LiveServer) -> Any:
    """The server's own runtime, read from this process (state lives on disk)."""
    from e2bfacade.runtime.local import LocalRuntime

    return LocalRuntime(server.sandbox_root)


def runtime_states(server: LiveServer) -> dict[str, str]:
    """sandbox id -> running | paused | dead, as the runtime sees them."""
    if not (server.sandbox_root / "sandboxes").exists():
        return {}
    return {info.sandbox_id: str(info.state) for info in runtime(server).list()}


def runtime_state(server: LiveServer, sandbox_id: str) -> str | None:
    """running | paused | dead, or None when the runtime has no such sandbox."""
    from e2bfacade.runtime.base import SandboxNotFound

    try:
        return str(runtime(server).status(sandbox_id).state)
    except SandboxNotFound:
        return None


def runtime_images(server: LiveServer) -> set[str]:
    if not (server.sandbox_root / "images").exists():
        return set()
    return set(runtime(server).list_images())


# ---------------------------------------------------------------------------------- API
def api_live(http: httpx.Client) -> dict[str, str]:
    """sandbox id -> wire state of everything the API lists for ``http``'s team (all pages)."""
    out: dict[str, str] = {}
    params: dict[str, str] = {"state": "running,paused", "limit": "100"}
    while True:
        response = http.get("/v2/sandboxes", params=params)
        assert response.status_code == 200, response.text
        out.update({s["sandboxID"]: s["state"] for s in response.json()})
        token = response.headers.get("X-Next-Token")
        if not token:
            return out
        params = {**params, "nextToken": token}


def disagreements(server: LiveServer) -> list[str]:
    """Every way the database and the runtime disagree, for all teams: an orphan (in the
    runtime, not live in the database), a ghost (live in the database, not in the runtime),
    a state mismatch, a row left in a transitional state, a dead sandbox. Empty: they agree
    exactly."""
    db = db_states(server)
    rt = runtime_states(server)
    problems = []
    for sid, state in sorted(db.items()):
        if state in TRANSITIONAL:
            problems.append(f"{sid}: row left {state}")
        elif sid not in rt:
            problems.append(f"{sid}: ghost (database says {state}, runtime has nothing)")
        elif rt[sid] != state:
            problems.append(f"{sid}: database says {state}, runtime says {rt[sid]}")
    for sid in sorted(rt.keys() - db.keys()):
        problems.append(f"{sid}: orphan in the runtime ({rt[sid]}), not live in the database")
    return problems


ACCESS_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3}) ')


def access_log_5xx(log_path: Path) -> list[str]:
    """gunicorn access-log lines of the server log whose status is 5xx."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    return [
        line.strip()
        for line in text.splitlines()
        if (m := ACCESS_LINE.search(line)) and m["status"].startswith("5")
    ]


def sandbox_detail(url: str, api_key: str, sandbox_id: str) -> dict[str, Any]:
    """``GET /sandboxes/{id}``'s body, asserting a 200."""
    response = httpx.get(
        f"{url}/sandboxes/{sandbox_id}", headers={"X-API-Key": api_key}, timeout=30
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body
