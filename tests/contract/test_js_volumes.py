"""E2B's volumes with the unmodified E2B JS SDK (e2b@2.51.0) against the live server,
through js/volumes.mjs: Volume.create, the content calls on the data plane (a streamed
ReadableStream upload among them, which the JS SDK sends chunked in half-duplex and the
Python SDK never does), a wrong token, and a sandbox that mounts the volume, reads what the
SDK wrote and writes what the SDK reads back. One live server: the session's."""

from __future__ import annotations

from pathlib import Path

from tests.support.live_server import LiveServer
from tests.support.node_support import run_sdk_script

JS_DIR = Path(__file__).resolve().parent / "js"


def test_js_sdk_volumes_content_and_a_sandbox_mounting_one(live_server_e2b: LiveServer) -> None:
    run_sdk_script(
        JS_DIR,
        "volumes.mjs",
        {
            "E2B_API_URL": live_server_e2b.url,
            "E2B_SANDBOX_URL": live_server_e2b.sandbox_url,
            "E2B_VOLUME_API_URL": live_server_e2b.sandbox_url,
            "E2B_API_KEY": live_server_e2b.api_key,
        },
        timeout=180,
    )
