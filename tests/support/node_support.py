"""Node.js for the tests that drive a JS package (the JS SDK smoke test, the browser test):
find node and npm, and install exactly the versions a folder's package-lock.json pins."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from pathlib import Path

import pytest


def require_node(purpose: str) -> tuple[str, str]:
    """(node, npm) — or fail the test, saying why, when either is missing or Node < 20."""
    tools = []
    for name in ("node", "npm"):
        path = shutil.which(name)
        if path is None:
            pytest.fail(
                f"{name} is not installed: {purpose} needs Node 20+ and npm "
                "(scripts/setup.sh installs them)",
                pytrace=False,
            )
        tools.append(path)
    node, npm = tools
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    if int(version.strip().lstrip("v").split(".")[0]) < 20:
        pytest.fail(f"{purpose} needs Node 20+, found {version}", pytrace=False)
    return node, npm


def npm_ci(folder: Path, package: str, npm: str) -> None:
    """Make ``folder/node_modules`` hold the pinned ``package`` and every other dependency
    package.json pins: on a clean clone (or after a pin changed) run ``npm ci``, which
    installs exactly what package-lock.json says."""
    pins = json.loads((folder / "package.json").read_text())["dependencies"]
    pins[package]  # noqa: B018 - a KeyError for a package the folder does not pin

    def installed(name: str) -> str | None:
        try:
            manifest = folder / "node_modules" / name / "package.json"
            return str(json.loads(manifest.read_text())["version"])
        except (OSError, ValueError, KeyError):
            return None

    def all_installed() -> bool:
        return all(installed(name) == version for name, version in pins.items())

    if all_installed():
        return
    # The suite's lines run side by side, and two of them may need one folder at once: one
    # npm ci at a time per folder (two unpacking into one node_modules break each other),
    # the second finding the first's install done.
    with open(folder / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all_installed():
            return
        install = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if install.returncode != 0 or not all_installed():
            pytest.fail(f"npm ci failed:\n{install.stdout}\n{install.stderr}", pytrace=False)


def run_sdk_script(folder: Path, script: str, env: dict[str, str], timeout: int = 180) -> None:
    """Run ``node script`` in ``folder`` (the pinned JS SDK installed first) with the E2B
    exports in ``env``; fail the test with its output unless it printed "<script>: ok"."""
    import os

    node, npm = require_node(f"the JS SDK test {script}")
    npm_ci(folder, "e2b", npm)
    full = {**os.environ, **env}
    full.pop("E2B_DEBUG", None)  # debug mode skips the API
    proc = subprocess.run(
        [node, script], cwd=folder, env=full, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0 or f"{script}: ok" not in proc.stdout:
        pytest.fail(f"{script} failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
