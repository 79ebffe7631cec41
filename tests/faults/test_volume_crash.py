"""A power cut with volumes, through the Python SDK: a running sandbox that wrote into a
volume it mounts, and a paused one that mounts it too, when every process of the service
and its runtime is SIGKILLed and no disk is left mounted (as tests/faults/test_power_cut.py
plays it). The service started again on the same database and sandbox root serves the
volume's content through the content API (its host mount made again, with the token handed
out before the cut); the volume stays undeletable while either sandbox lives (paused by the
cut counts); each sandbox resumes with ``connect`` (a cold boot from its disk) with the
volume mounted at its own path, still shared live; after both are killed it is deleted, and
its storage with it. One deployment, its own database and sandbox root."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from e2b import Sandbox, Volume, VolumeException

from tests.support.live_checks import sandbox_detail
from tests.support.live_server import Deployment, Server
from tests.support.runtime_support import power_cut

A_PATH = "/mnt/data"  # where the running sandbox mounts the volume
B_PATH = "/data"  # and the paused one: each sandbox has its own path
BLOB = 1 << 20


def mounted_at(sbx: Sandbox, path: str) -> bool:
    """Whether the guest has a file system mounted exactly at ``path``."""
    targets = sbx.commands.run("cut -d' ' -f5 /proc/self/mountinfo").stdout.split()
    return path in targets


def test_a_power_cut_keeps_a_volume_its_content_and_both_sandboxes_mounts(
    cut_deployment: tuple[Deployment, Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    dep, server = cut_deployment
    api_key = dep.take_team().api_key
    monkeypatch.setenv("E2B_API_URL", server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", server.sandbox_url)
    monkeypatch.setenv("E2B_VOLUME_API_URL", server.sandbox_url)
    monkeypatch.setenv("E2B_API_KEY", api_key)

    vol = Volume.create(f"crash-{uuid.uuid4().hex[:12]}")
    a = Sandbox.create(timeout=600, volume_mounts={A_PATH: vol})
    b = Sandbox.create(timeout=600, volume_mounts={B_PATH: vol.name})
    # The guest's ``user`` writes (commands.run's default user, named to be sure).
    made = a.commands.run(
        f"mkdir -p {A_PATH}/dir/sub && echo from-a > {A_PATH}/dir/sub/a.txt"
        f" && head -c {BLOB} /dev/urandom > {A_PATH}/blob"
        f" && sha256sum {A_PATH}/blob && sync",
        user="user",
    )
    blob_sha = made.stdout.split()[0]
    b.commands.run(f"echo from-b > {B_PATH}/b.txt && sync", user="user")
    assert b.pause()
    assert sandbox_detail(server.url, api_key, b.sandbox_id)["state"] == "paused"

    server.kill()
    power_cut(server.sandbox_root)
    server.start()
    server.run_worker_once()  # one reconcile now, rather than waiting for the worker's

    # The content API mounts the volume on the host again; the token from before still works.
    assert vol.read_file("/dir/sub/a.txt") == "from-a\n"
    assert vol.read_file("/b.txt") == "from-b\n"
    blob = vol.read_file("/blob", format="bytes")
    assert len(blob) == BLOB and hashlib.sha256(blob).hexdigest() == blob_sha
    assert sorted(e.name for e in vol.list("/")) == ["b.txt", "blob", "dir"]
    for sbx in (a, b):
        info = sandbox_detail(server.url, api_key, sbx.sandbox_id)
        assert info["state"] == "paused", info  # the cut paused the running one too
        assert info["volumeMounts"], info
    # Both sandboxes live (paused), so the volume may not go.
    with pytest.raises(VolumeException, match="is mounted by a sandbox"):
        Volume.destroy(vol.volume_id)

    a2 = Sandbox.connect(a.sandbox_id, timeout=600)
    b2 = Sandbox.connect(b.sandbox_id, timeout=600)
    assert a2.get_info().volume_mounts == [{"name": vol.name, "path": A_PATH}]
    assert b2.get_info().volume_mounts == [{"name": vol.name, "path": B_PATH}]
    for sbx, path in ((a2, A_PATH), (b2, B_PATH)):
        assert mounted_at(sbx, path), path
        assert sbx.files.read(f"{path}/dir/sub/a.txt") == "from-a\n"
        assert sbx.files.read(f"{path}/b.txt") == "from-b\n"
        assert sbx.commands.run(f"sha256sum {path}/blob").stdout.split()[0] == blob_sha
        assert sbx.commands.run(f"stat -c %U {path}/b.txt").stdout.strip() == "user"
    # Still one file system shared live: a write in one is read at once in the other.
    b2.commands.run(f"echo after-the-cut > {B_PATH}/after.txt", user="user")
    assert a2.files.read(f"{A_PATH}/after.txt") == "after-the-cut\n"
    a2.files.write(f"{A_PATH}/from-a2.txt", "written by a after")
    assert b2.commands.run(f"cat {B_PATH}/from-a2.txt").stdout == "written by a after"
    assert vol.read_file("/after.txt") == "after-the-cut\n"

    assert Sandbox.kill(a.sandbox_id) is True
    with pytest.raises(VolumeException, match="is mounted by a sandbox"):
        Volume.destroy(vol.volume_id)  # b still mounts it
    assert vol.read_file("/from-a2.txt") == "written by a after"
    assert Sandbox.kill(b.sandbox_id) is True
    assert Volume.destroy(vol.volume_id) is True
    assert vol.volume_id not in {v.volume_id for v in Volume.list()}
    assert not (server.sandbox_root / "volumes" / vol.volume_id).exists()
    assert dep.runtime_ids() == set()
