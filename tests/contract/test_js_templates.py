"""Template SDK v2 builds with the unmodified E2B JS SDK (e2b@2.51.0) against the live
server, through js/template.mjs: three COPY archives uploaded concurrently, RUN, ENV and a
start command with a ready check, a build named ``name:v1`` and a sandbox of it, a failing
RUN's exact message, tags. The JS SDK sends its JSON bodies chunked and its uploads in
parallel, which the Python SDK never does, so it gets its own end-to-end run."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.support.live_server import LiveServer
from tests.support.node_support import run_sdk_script

JS_DIR = Path(__file__).resolve().parent / "js"


def test_js_sdk_builds_a_template_and_starts_sandboxes_of_it(live_server_e2b: LiveServer) -> None:
    run_sdk_script(
        JS_DIR,
        "template.mjs",
        {
            "E2B_API_URL": live_server_e2b.url,
            "E2B_SANDBOX_URL": live_server_e2b.sandbox_url,
            "E2B_API_KEY": live_server_e2b.api_key,
            "TPL_NAME": f"js-tpl-{uuid.uuid4().hex[:8]}",
        },
        timeout=300,
    )
