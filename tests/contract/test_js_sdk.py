"""The unmodified E2B JS SDK (e2b@2.51.0, pinned in js/package.json and js/package-lock.json)
against the live server, through js/smoke.mjs: create, getInfo, list, pause, connect
(resume), kill. The JS SDK differs from the Python one on the wire (it never sends
Idempotency-Key, it sends bodies chunked, it decides 404/409 from the body's ``code``), so
it gets its own end-to-end run."""

from __future__ import annotations

from pathlib import Path

from tests.support.live_server import LiveServer
from tests.support.node_support import run_sdk_script

JS_DIR = Path(__file__).resolve().parent / "js"


def test_js_sdk_smoke(live_server_e2b: LiveServer) -> None:
    run_sdk_script(
        JS_DIR,
        "smoke.mjs",
        {"E2B_API_URL": live_server_e2b.url, "E2B_API_KEY": live_server_e2b.api_key},
        timeout=120,
    )


def test_js_sdk_quickstart_data_plane(live_server_e2b: LiveServer) -> None:
    run_sdk_script(
        JS_DIR,
        "dataplane.mjs",
        {
            "E2B_API_URL": live_server_e2b.url,
            "E2B_SANDBOX_URL": live_server_e2b.sandbox_url,
            "E2B_API_KEY": live_server_e2b.api_key,
        },
        timeout=120,
    )
