"""``@e2b/code-interpreter`` (JS, pinned in tests/contract/js/package.json) against the live
server: the quickstart in tests/contract/js/codeinterpreter.mjs, with the printed exports only."""

from __future__ import annotations

from pathlib import Path

from tests.support.live_server import LiveServer
from tests.support.node_support import run_sdk_script

JS_DIR = Path(__file__).resolve().parents[1] / "contract" / "js"


def test_js_code_interpreter_quickstart(ci_server: LiveServer) -> None:
    run_sdk_script(
        JS_DIR,
        "codeinterpreter.mjs",
        {
            "E2B_API_URL": ci_server.url,
            "E2B_SANDBOX_URL": ci_server.sandbox_url,
            "E2B_API_KEY": ci_server.api_key,
        },
        timeout=180,
    )
