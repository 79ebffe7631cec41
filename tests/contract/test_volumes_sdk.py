"""E2B's volumes through the synchronous Python SDK (``e2b.Volume``, ``Sandbox.create(...,
volume_mounts=...)``) against the live server: the control routes, the content API on the
data plane (``E2B_VOLUME_API_URL``, as a deployment points the SDK at it), and mounts shared
live between sandboxes that outlive them. One live server: the session's."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from e2b import Sandbox, Volume, VolumeException

from tests.support.live_server import LiveServer

MakeSandbox = Callable[..., Sandbox]


@pytest.fixture
def volume_env(envd_env: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    """The SDK's volume content calls go to the data plane, as ``scripts/serve.sh`` prints
    it (without it they would go to ``https://api.<domain>``)."""
    monkeypatch.setenv("E2B_VOLUME_API_URL", envd_env.sandbox_url)
    return envd_env


@pytest.fixture
def volume(volume_env: LiveServer) -> Iterator[Volume]:
    """A new volume of the contract team, destroyed at teardown (after the test's sandboxes:
    this fixture is set up before ``make_sandbox``'s, so it is torn down after them)."""
    vol = Volume.create(f"v-{uuid.uuid4().hex[:12]}")
    yield vol
    Volume.destroy(vol.volume_id)


def test_a_volume_is_made_listed_written_read_and_destroyed_through_the_sdk(
    volume_env: LiveServer,
) -> None:
    name = f"sdk-{uuid.uuid4().hex[:12]}"
    vol = Volume.create(name)
    assert vol.name == name
    assert uuid.UUID(vol.volume_id)
    assert (vol.volume_id, name) in {(v.volume_id, v.name) for v in Volume.list()}
    with pytest.raises(VolumeException, match=f"Volume with name '{name}' already exists"):
        Volume.create(name)
    # connect() reads the volume back with a token of its own (GET /volumes/{id}).
    again = Volume.connect(vol.volume_id)
    assert again.name == name and again.token

    entry = vol.write_file("/notes/hello.txt", "hello, volume", force=True)
    assert entry.name == "hello.txt" and entry.size == len("hello, volume")
    assert vol.read_file("/notes/hello.txt") == "hello, volume"
    assert again.read_file("/notes/hello.txt", format="bytes") == b"hello, volume"
    assert vol.exists("/notes/hello.txt")
    assert not vol.exists("/notes/missing.txt")
    assert [e.name for e in vol.list("/notes")] == ["hello.txt"]
    vol.remove("/notes/hello.txt")
    assert not vol.exists("/notes/hello.txt")

    assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False  # the SDK's answer to a 404
    assert vol.volume_id not in {v.volume_id for v in Volume.list()}


def test_sandboxes_share_a_volume_live_and_it_outlives_them(
    volume: Volume, make_sandbox: MakeSandbox
) -> None:
    a = make_sandbox(volume_mounts={"/mnt/data": volume})
    b = make_sandbox(volume_mounts={"/mnt/data": volume.name})  # by name, as the SDK allows
    assert a.get_info().volume_mounts == [{"name": volume.name, "path": "/mnt/data"}]

    # Live: a write in one sandbox is read at once in the other, and by the content API.
    a.files.write("/mnt/data/from-a.txt", "written in a")
    assert b.files.read("/mnt/data/from-a.txt") == "written in a"
    b.commands.run("echo written in b > /mnt/data/from-b.txt")
    assert volume.read_file("/from-b.txt") == "written in b\n"
    volume.write_file("/from-api.txt", "written by the API")
    assert a.commands.run("cat /mnt/data/from-api.txt").stdout == "written by the API"
    # The guest's user owns what it wrote, in every sandbox.
    owner = a.commands.run("stat -c %U /mnt/data/from-b.txt").stdout.strip()
    assert owner == "user"

    # Refused while a live sandbox mounts it, and nothing is lost.
    with pytest.raises(VolumeException, match="is mounted by a sandbox"):
        Volume.destroy(volume.volume_id)
    a.kill()
    b.kill()

    # It outlives them: a new sandbox sees everything.
    c = make_sandbox(volume_mounts={"/data": volume})
    listed = c.commands.run("ls /data").stdout.split()
    assert sorted(listed) == ["from-a.txt", "from-api.txt", "from-b.txt"]
    assert c.files.read("/data/from-a.txt") == "written in a"
    # A sandbox that names no volume has none of it.
    plain = make_sandbox()
    assert plain.get_info().volume_mounts == []
    assert not plain.files.exists("/data/from-a.txt")
    c.kill()
