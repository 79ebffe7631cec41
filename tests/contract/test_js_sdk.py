"""The unmodified E2B JS SDK (e2b@2.51.0, pinned in js/package.json and js/package-lock.json)
against the live server, through js/smoke.mjs: create, getInfo, list, pause, connect
(resume), kill. The JS SDK differs from the Python one on the wire (it never sends
Idempotency-Key, it sends bodies chunked, it decides 404/409 from the body's ``code``), so
it gets its own end-to-end run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.live_server import LiveServer
from tests.support.node_support import npm_ci, require_node

JS_DIR = Path(__file__).resolve().parent / "js"


def test_js_sdk_smoke(live_server_e2b: LiveServer) -> None:
    node, npm = require_node("the JS SDK contract test")
    npm_ci(JS_DIR, "e2b", npm)

    env = {
        **os.environ,
        "E2B_API_URL": live_server_e2b.url,
        "E2B_API_KEY": live_server_e2b.api_key,
    }
    env.pop("E2B_DEBUG", None)  # debug mode skips the API
    proc = subprocess.run(
        [node, "smoke.mjs"], cwd=JS_DIR, env=env, capture_output=True, text=True, timeout=120
    )

    assert proc.returncode == 0, f"smoke.mjs failed:\n{proc.stdout}\n{proc.stderr}"
    assert "smoke.mjs: ok" in proc.stdout


def test_js_sdk_quickstart_data_plane(live_server_e2b: LiveServer) -> None:
    node, npm = require_node("the JS SDK contract test")
    npm_ci(JS_DIR, "e2b", npm)
    env = {
        **os.environ,
        "E2B_API_URL": live_server_e2b.url,
        "E2B_SANDBOX_URL": live_server_e2b.sandbox_url,
        "E2B_API_KEY": live_server_e2b.api_key,
    }
    env.pop("E2B_DEBUG", None)
    proc = subprocess.run(
        [node, "dataplane.mjs"], cwd=JS_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"dataplane.mjs failed:\n{proc.stdout}\n{proc.stderr}"
    assert "dataplane.mjs: ok" in proc.stdout
