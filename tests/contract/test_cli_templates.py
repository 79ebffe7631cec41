"""E2B's own CLI (``@e2b/cli``, pinned in js/package.json and js/package-lock.json) against
the live server: ``e2b template list`` and ``e2b template delete`` on a template the JS SDK
built (``e2b template create`` is tests/templates/test_cli_create.py: it needs a registry).

The CLI finds the API as the JS SDK does (``E2B_API_URL``, ``E2B_API_KEY``; with no key it
reads ``~/.e2b/config.json`` from ``e2b auth login``, so HOME is an empty directory here)
and checks npm for a newer version unless ``NO_UPDATE_NOTIFIER`` is set (nothing may leave
this machine in a test)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.live_server import LiveServer
from tests.support.node_support import npm_ci, require_node

JS_DIR = Path(__file__).resolve().parent / "js"
CLI = JS_DIR / "node_modules" / "@e2b" / "cli" / "dist" / "index.js"


def cli(server: LiveServer, *args: str, cwd: Path, timeout: float = 240) -> str:
    """``e2b <args>`` pointed at ``server``; fails the test with its output unless it
    exits 0."""
    node, npm = require_node("the E2B CLI test")
    npm_ci(JS_DIR, "@e2b/cli", npm)
    with tempfile.TemporaryDirectory(prefix="e2b-cli-home-") as home:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": home,
            "E2B_API_URL": server.url,
            "E2B_SANDBOX_URL": server.sandbox_url,
            "E2B_API_KEY": server.api_key,
            "NO_UPDATE_NOTIFIER": "1",
            "NO_COLOR": "1",
        }
        proc = subprocess.run(
            [node, str(CLI), *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    if proc.returncode != 0:
        pytest.fail(
            f"e2b {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}",
            pytrace=False,
        )
    return proc.stdout


def test_cli_lists_templates_and_deletes_one(sdk_env: LiveServer, tmp_path: Path) -> None:
    from e2b import Template

    live_server_e2b = sdk_env
    name = f"cli-{uuid.uuid4().hex[:8]}"
    info = Template.build(
        Template().from_template("base").run_cmd("true"), name, cpu_count=1, memory_mb=1024
    )
    template_id = info.template_id

    listed = json.loads(cli(live_server_e2b, "template", "list", "-f", "json", cwd=tmp_path))
    mine = [t for t in listed if t["templateID"] == template_id]
    assert len(mine) == 1, listed
    assert name in mine[0]["aliases"] or name in mine[0].get("names", []), mine
    assert mine[0]["cpuCount"] == 1 and mine[0]["memoryMB"] == 1024, mine
    assert "base" in {a for t in listed for a in t["aliases"]}

    cli(live_server_e2b, "template", "delete", template_id, "-y", cwd=tmp_path)
    gone = httpx.get(
        f"{live_server_e2b.url}/templates/{template_id}",
        headers={"X-API-Key": live_server_e2b.api_key},
        timeout=30,
    )
    assert gone.status_code == 404, gone.text
    listed = json.loads(cli(live_server_e2b, "template", "list", "-f", "json", cwd=tmp_path))
    assert template_id not in {t["templateID"] for t in listed}
