"""A sandbox's logs and metrics through the real clients against the live server: E2B's CLI
(``e2b sandbox logs``, ``--follow``, ``e2b sandbox metrics``, as pinned in js/package.json)
and the Python SDK (``Sandbox.get_metrics``, and its API client's batch metrics and logs
calls, which its high-level classes do not wrap). The JS SDK pinned here calls none of
these routes but ``/sandboxes/{id}/metrics`` (tests/contract/js/smoke.mjs)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
from e2b import Sandbox

from tests.contract.test_cli_templates import CLI, JS_DIR, cli
from tests.support.live_server import LiveServer
from tests.support.node_support import npm_ci, require_node
from tests.support.waiting import eventually, stays


def test_cli_prints_a_sandboxs_lifecycle_logs(
    sdk_env: LiveServer, make_sandbox: Callable[..., Sandbox], tmp_path: Path
) -> None:
    sandbox = make_sandbox()
    sandbox.pause()
    Sandbox.connect(sandbox.sandbox_id)

    out = cli(sdk_env, "sandbox", "logs", sandbox.sandbox_id, "--format", "json", cwd=tmp_path)

    printed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [p["event"] for p in printed] == ["created", "paused", "resumed"], out
    assert {p["logger"] for p in printed} == {"lifecycle"}
    assert [p["level"] for p in printed] == ["info"] * 3


def test_cli_follows_a_sandboxs_logs_until_it_ends(
    sdk_env: LiveServer, make_sandbox: Callable[..., Sandbox], tmp_path: Path
) -> None:
    sandbox = make_sandbox()
    node, npm = require_node("the E2B CLI test")
    npm_ci(JS_DIR, "@e2b/cli", npm)
    with tempfile.TemporaryDirectory(prefix="e2b-cli-home-") as home:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": home,
            "E2B_API_URL": sdk_env.url,
            "E2B_SANDBOX_URL": sdk_env.sandbox_url,
            "E2B_API_KEY": sdk_env.api_key,
            "NO_UPDATE_NOTIFIER": "1",
            "NO_COLOR": "1",
        }
        follow = subprocess.Popen(
            [node, str(CLI), "sandbox", "logs", sandbox.sandbox_id, "--follow"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            stdout = follow.stdout
            assert stdout is not None
            lines: list[str] = []

            def read_line() -> str:
                lines.append(stdout.readline())
                return "".join(lines)

            seen = eventually(
                read_line,
                until=lambda text: "sandbox created from template" in text,
                within=60,
                what="the creation's log line",
            )
            # Still following: it has not stopped while the sandbox runs.
            stays(lambda: follow.poll() is not None, for_=1.5, what="the CLI stopping early")
            sandbox.kill()
            rest, _ = follow.communicate(timeout=60)
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.communicate()
    assert follow.returncode == 0, seen + rest
    assert "Stopped printing logs" in rest, seen + rest


def test_cli_prints_a_sandboxs_metrics(
    sdk_env: LiveServer, sandbox: Sandbox, tmp_path: Path
) -> None:
    out = cli(sdk_env, "sandbox", "metrics", sandbox.sandbox_id, "--format", "json", cwd=tmp_path)

    printed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert printed, out
    assert printed[0]["cpuCount"] > 0 and printed[0]["memTotal"] > 0


def test_python_sdk_reads_metrics_one_by_one_and_in_a_batch(
    sdk_env: LiveServer, make_sandbox: Callable[..., Sandbox]
) -> None:
    from e2b.api.client.api.sandboxes import get_sandboxes_metrics
    from e2b.api.client.client import AuthenticatedClient
    from e2b.api.client.models import SandboxesWithMetrics

    first, second = make_sandbox(), make_sandbox()
    assert first.get_metrics()[0].cpu_count > 0

    client = AuthenticatedClient(
        base_url=sdk_env.url, token=sdk_env.api_key, auth_header_name="X-API-Key", prefix=""
    )
    with client:
        found = get_sandboxes_metrics.sync(
            client=client, sandbox_ids=[first.sandbox_id, second.sandbox_id]
        )
    assert isinstance(found, SandboxesWithMetrics), found
    metrics = found.sandboxes if isinstance(found.sandboxes, dict) else {}
    assert sorted(metrics) == sorted([first.sandbox_id, second.sandbox_id]), found
    assert metrics[first.sandbox_id]["memTotal"] > 0


def test_python_sdk_client_reads_v1_and_v2_logs(
    sdk_env: LiveServer, make_sandbox: Callable[..., Sandbox], other_http: httpx.Client
) -> None:
    from e2b.api.client.api.sandboxes import (
        get_sandboxes_sandbox_id_logs,
        get_v_2_sandboxes_sandbox_id_logs,
    )
    from e2b.api.client.client import AuthenticatedClient
    from e2b.api.client.models import LogLevel, SandboxLogs, SandboxLogsV2Response

    sandbox = make_sandbox()
    sandbox.kill()
    client = AuthenticatedClient(
        base_url=sdk_env.url, token=sdk_env.api_key, auth_header_name="X-API-Key", prefix=""
    )
    with client:
        v1 = get_sandboxes_sandbox_id_logs.sync(sandbox.sandbox_id, client=client)
        v2 = get_v_2_sandboxes_sandbox_id_logs.sync(sandbox.sandbox_id, client=client)
    assert isinstance(v1, SandboxLogs), v1
    assert isinstance(v2, SandboxLogsV2Response), v2
    assert [e.fields["event"] for e in v2.logs] == ["created", "killed"]
    assert {e.level for e in v2.logs} == {LogLevel.INFO}
    assert len(v1.logs) == len(v1.log_entries) == 2
    # Another team: E2B's 404, raw.
    other = other_http.get(f"/v2/sandboxes/{sandbox.sandbox_id}/logs")
    assert other.status_code == 404 and other.json()["code"] == 404
