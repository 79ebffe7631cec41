"""The unmodified E2B JS SDK (e2b@2.51.0, pinned in js/package.json and js/package-lock.json)
against the live server, through js/smoke.mjs: create, getInfo, list, pause, connect
(resume), kill. The JS SDK differs from the Python one on the wire (it never sends
Idempotency-Key, it sends bodies chunked, it decides 404/409 from the body's ``code``), so
it gets its own end-to-end run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.live_server import LiveServer

JS_DIR = Path(__file__).resolve().parent / "js"
PINNED = json.loads((JS_DIR / "package.json").read_text())["dependencies"]["e2b"]


def _installed_version() -> str | None:
    try:
        return str(json.loads((JS_DIR / "node_modules/e2b/package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: the JS SDK contract test needs Node 20+ and npm "
            "(scripts/setup.sh installs them)",
            pytrace=False,
        )
    return path


def test_js_sdk_smoke(live_server_e2b: LiveServer) -> None:
    node, npm = _tool("node"), _tool("npm")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    if int(version.strip().lstrip("v").split(".")[0]) < 20:
        pytest.fail(f"the JS SDK needs Node 20+, found {version}", pytrace=False)
    if _installed_version() != PINNED:
        # A clean clone (or a stale install): install exactly what package-lock.json pins.
        install = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=JS_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if install.returncode != 0 or _installed_version() != PINNED:
            pytest.fail(f"npm ci failed:\n{install.stdout}\n{install.stderr}", pytrace=False)

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
