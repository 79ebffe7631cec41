"""The admin in a real browser: headless Chromium (Debian's ``chromium``, installed by
scripts/setup.sh) driven by playwright-core (pinned in package.json / package-lock.json)
through admin_flow.mjs, against a live gunicorn server.

An operator holding only a sandbox id logs in, finds the sandbox, follows it to its
idempotency record, and sees the key, its state and the stored response with the
envdAccessToken redacted. The screenshot stays in tests/browser/artifacts/ (gitignored) for
a human to look at."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.live_server import (
    LiveServer,
    ServerError,
    live_server,
    manage,
    suite_database_url,
)
from tests.support.node_support import npm_ci, require_node

HERE = Path(__file__).resolve().parent
ARTIFACTS = HERE / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    try:
        with live_server(suite_database_url(), workers=2) as running:
            yield running
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_operator_finds_a_sandboxs_idempotency_record_in_the_browser(
    server: LiveServer,
) -> None:
    node, npm = require_node("the browser test")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: scripts/setup.sh installs Debian's chromium", pytrace=False
        )
    npm_ci(HERE, "playwright-core", npm)

    password = secrets.token_urlsafe(16)
    manage(
        {**server.env, "DJANGO_SUPERUSER_PASSWORD": password},
        "createsuperuser",
        "--noinput",
        "--username",
        "operator",
        "--email",
        "operator@example.invalid",
    )
    key = f"browser-{secrets.token_hex(6)}"
    with httpx.Client(
        base_url=server.url, headers={"X-API-Key": server.api_key}, timeout=30
    ) as http:
        created = http.post(
            "/v2/sandboxes",
            json={"templateID": "base", "timeout": 300},
            headers={"Idempotency-Key": key},
        )
        assert created.status_code == 201, created.text
        sandbox = created.json()

        ARTIFACTS.mkdir(exist_ok=True)
        vendor = "postgresql" if server.env["DATABASE_URL"].startswith("postgres") else "sqlite"
        screenshot = ARTIFACTS / f"admin-idempotency-record-{vendor}.png"
        for stale in (screenshot, screenshot.with_name(f"{screenshot.stem}-failed.png")):
            stale.unlink(missing_ok=True)
        env = {
            **os.environ,
            "BASE_URL": server.url,
            "ADMIN_USER": "operator",
            "ADMIN_PASSWORD": password,
            "SANDBOX_ID": sandbox["sandboxID"],
            "IDEMPOTENCY_KEY": key,
            "SECRET_TOKEN": sandbox["envdAccessToken"],
            "SCREENSHOT": str(screenshot),
            "CHROMIUM": str(CHROMIUM),
        }
        try:
            proc = subprocess.run(
                [node, "admin_flow.mjs"],
                cwd=HERE,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
        finally:
            http.delete(f"/sandboxes/{sandbox['sandboxID']}")

    if proc.returncode != 0:
        pytest.fail(
            f"admin_flow.mjs failed:\n{proc.stdout}\n{proc.stderr}\n"
            f"server log (tail):\n{server.log_tail(30)}",
            pytrace=False,
        )
    assert "admin_flow.mjs: ok" in proc.stdout
    # A real page, not a blank or an error: a full-page PNG of the admin is tens of KB.
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000
