"""E2B's own CLI (``@e2b/cli``, pinned in js/package.json) against the live server, for
every ``sandbox`` command that touches the server and ``template publish``/``unpublish``:
``list``, ``info``, ``exec``, ``pause``, ``resume``, ``snapshot create/list/delete``,
``kill``; a published template is started by the other team until it is unpublished.
(``template list``/``delete`` are tests/contract/test_cli_templates.py, ``template create``
tests/templates/test_cli_create.py; ``sandbox logs`` and ``metrics`` are not this file's.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
from e2b import Sandbox

from tests.contract.test_cli_templates import cli
from tests.support.live_server import LiveServer


def test_cli_drives_a_sandbox_through_its_life(
    envd_env: LiveServer,
    sandbox: Sandbox,
    delete_template_later: Callable[[str], str],
    tmp_path: Path,
) -> None:
    server, sid = envd_env, sandbox.sandbox_id

    listed = json.loads(cli(server, "sandbox", "list", "-f", "json", cwd=tmp_path))
    info = json.loads(cli(server, "sandbox", "info", sid, "-f", "json", cwd=tmp_path))
    out = cli(server, "sandbox", "exec", sid, "echo", "hello-from-cli", cwd=tmp_path)
    cli(server, "sandbox", "pause", sid, cwd=tmp_path)
    paused = json.loads(cli(server, "sandbox", "list", "-s", "paused", "-f", "json", cwd=tmp_path))
    cli(server, "sandbox", "resume", sid, cwd=tmp_path)
    name = f"cli-snap-{uuid.uuid4().hex[:8]}"
    cli(server, "sandbox", "snapshot", "create", sid, "-n", name, cwd=tmp_path)
    snapshots = json.loads(cli(server, "sandbox", "snapshot", "list", "-f", "json", cwd=tmp_path))

    assert sid in {s["sandboxId"] for s in listed}, listed
    assert info["sandboxId"] == sid and info["state"] == "running", info
    assert "hello-from-cli" in out
    assert sid in {s["sandboxId"] for s in paused}, paused
    mine = [s for s in snapshots if name in json.dumps(s)]
    assert len(mine) == 1, snapshots
    snapshot_id = delete_template_later(mine[0]["snapshotId"])

    cli(server, "sandbox", "snapshot", "delete", snapshot_id, cwd=tmp_path)
    cli(server, "sandbox", "kill", sid, cwd=tmp_path)

    after = json.loads(cli(server, "sandbox", "snapshot", "list", "-f", "json", cwd=tmp_path))
    assert snapshot_id not in {s["snapshotId"] for s in after}
    gone = httpx.get(
        f"{server.url}/sandboxes/{sid}", headers={"X-API-Key": server.api_key}, timeout=30
    )
    assert gone.status_code == 404, gone.text


def test_cli_publishes_a_template_for_other_teams_and_unpublishes_it(
    sdk_env: LiveServer, kill_later: Callable[[str], str], tmp_path: Path
) -> None:
    from e2b import Template

    server = sdk_env
    name = f"cli-pub-{uuid.uuid4().hex[:8]}"
    template_id = Template.build(
        Template().from_template("base").run_cmd("true"), name, cpu_count=1, memory_mb=512
    ).template_id

    def other_starts() -> httpx.Response:
        response = httpx.post(
            f"{server.url}/v2/sandboxes",
            json={"templateID": template_id, "timeout": 60},
            headers={"X-API-Key": server.other_api_key},
            timeout=120,
        )
        if response.status_code == 201:
            httpx.delete(
                f"{server.url}/sandboxes/{response.json()['sandboxID']}",
                headers={"X-API-Key": server.other_api_key},
                timeout=60,
            )
        return response

    try:
        assert other_starts().status_code == 404
        cli(server, "template", "publish", name, "-y", cwd=tmp_path)
        listed = json.loads(cli(server, "template", "list", "-f", "json", cwd=tmp_path))
        published = other_starts()
        cli(server, "template", "unpublish", name, "-y", cwd=tmp_path)
        unpublished = other_starts()
    finally:
        cli(server, "template", "delete", template_id, "-y", cwd=tmp_path)

    assert [t["public"] for t in listed if t["templateID"] == template_id] == [True]
    assert published.status_code == 201, published.text
    assert unpublished.status_code == 404, unpublished.text
