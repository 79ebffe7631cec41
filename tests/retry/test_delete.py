"""The retry table's DELETE rows: a sandbox (running or paused) and a template (an imported
one, a snapshot, a named snapshot)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.retry.support import (
    ROUNDS,
    SEQUENTIAL,
    checked,
    concurrently,
    delete,
    pause,
    sequential,
    statuses,
)
from tests.support import live_checks as lc
from tests.support.live_server import REPO, LiveServer


# ------------------------------------------------------------------------- DELETE sandbox
@pytest.mark.parametrize("n", SEQUENTIAL)
def test_delete_sandbox_repeated_answers_204_once_then_404_and_kills_it(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], n: int
) -> None:
    sandbox_id = new_sandbox()

    responses = sequential(http, n, delete(f"/sandboxes/{sandbox_id}"))

    assert statuses(responses) == [204] + [404] * (n - 1)
    assert lc.runtime_state(server, sandbox_id) is None
    assert lc.db_row(server, sandbox_id)[0] == "killed"  # type: ignore[index]
    assert checked(http.get(f"/sandboxes/{sandbox_id}")).status_code == 404


def test_delete_paused_sandbox_repeated_answers_204_once_then_404(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    sandbox_id = new_sandbox()
    pause(http, sandbox_id)

    responses = sequential(http, 5, delete(f"/sandboxes/{sandbox_id}"))

    assert statuses(responses) == [204] + [404] * 4
    assert lc.runtime_state(server, sandbox_id) is None
    assert lc.db_row(server, sandbox_id)[0] == "killed"  # type: ignore[index]


def test_delete_sandbox_from_two_callers_at_once_answers_one_204_and_one_404(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    for _ in range(ROUNDS):
        sandbox_id = new_sandbox()
        responses = concurrently(server, delete(f"/sandboxes/{sandbox_id}"))
        assert sorted(statuses(responses)) == [204, 404]
        assert lc.runtime_state(server, sandbox_id) is None
        assert lc.db_row(server, sandbox_id)[0] == "killed"  # type: ignore[index]


# ------------------------------------------------------------------------ DELETE template
def _import_team_template(server: LiveServer, name: str) -> str:
    """A private template of the test team, imported from a tiny rootfs tarball."""
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs"
        (rootfs / "etc").mkdir(parents=True)
        (rootfs / "etc" / "hostname").write_text("tiny\n")
        tar_path = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar_path, "w") as tar:
            tar.add(rootfs, arcname=".")
        proc = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "import_template",
                name,
                str(tar_path),
                "--team",
                "contract",
            ],
            cwd=REPO,
            env=server.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()[-1]  # "imported NAME as template ID"


def _make_template(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], kind: str
) -> tuple[str, str]:
    """(the reference DELETE uses, the template id) of a fresh template of ``kind``."""
    if kind == "template":
        name = f"tiny-{uuid.uuid4().hex[:8]}"
        return name, _import_team_template(server, name)
    source = new_sandbox()
    snapshot_name = f"team/snap-{uuid.uuid4().hex[:8]}:v1" if kind == "named snapshot" else None
    response = checked(http.post(f"/sandboxes/{source}/snapshots", json={"name": snapshot_name}))
    assert response.status_code == 201, response.text
    snapshot_id = str(response.json()["snapshotID"])
    return (snapshot_name or snapshot_id), snapshot_id


@pytest.mark.parametrize("n", SEQUENTIAL)
@pytest.mark.parametrize("kind", ["snapshot", "named snapshot", "template"])
def test_delete_template_repeated_answers_204_once_then_404_and_deletes_its_image(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str], kind: str, n: int
) -> None:
    ref, template_id = _make_template(server, http, new_sandbox, kind)
    assert template_id in lc.runtime_images(server)

    # The SDK url-encodes the id: a name holding '/' or ':' travels as %2F / %3A.
    responses = sequential(http, n, delete(f"/templates/{quote(ref, safe='')}"))

    assert statuses(responses) == [204] + [404] * (n - 1)
    assert template_id not in lc.runtime_images(server)
    assert template_id not in lc.template_ids(server)


def test_delete_template_while_a_sandbox_uses_it_answers_400_until_it_is_killed(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    _, snapshot_id = _make_template(server, http, new_sandbox, "snapshot")
    user = new_sandbox(templateID=snapshot_id)

    refused = sequential(http, 5, delete(f"/templates/{snapshot_id}"))
    assert statuses(refused) == [400] * 5
    assert snapshot_id in lc.runtime_images(server)

    assert checked(http.delete(f"/sandboxes/{user}")).status_code == 204
    responses = sequential(http, 5, delete(f"/templates/{snapshot_id}"))
    assert statuses(responses) == [204] + [404] * 4
    assert snapshot_id not in lc.runtime_images(server)


def test_delete_template_from_two_callers_at_once_answers_one_204_and_one_404(
    server: LiveServer, http: httpx.Client, new_sandbox: Callable[..., str]
) -> None:
    source = new_sandbox()
    for _ in range(ROUNDS * 2):
        response = checked(http.post(f"/sandboxes/{source}/snapshots", json={}))
        assert response.status_code == 201
        snapshot_id = response.json()["snapshotID"]
        responses = concurrently(server, delete(f"/templates/{snapshot_id}"))
        assert sorted(statuses(responses)) == [204, 404]
        assert snapshot_id not in lc.runtime_images(server)
        assert snapshot_id not in lc.template_ids(server)
