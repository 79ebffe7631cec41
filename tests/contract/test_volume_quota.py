"""Volume limits and team isolation through the Python SDK, against a live server of its
own with ``VOLUME_MAX_MB=16`` and ``VOLUME_MAX_MB_PER_TEAM=40``: a guest filling a volume
meets ENOSPC and the host's disk holds at most the volume's size for it; a content API
upload larger than the volume is a clear SDK error that keeps the file it would have
replaced; a create past the team's budget is a clear 400 that makes nothing; and another
team can neither see, read, delete, mount nor reach the content of a volume (its own
volume's token included). One live server: this module's (not the contract session's)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    Sandbox,
    SandboxException,
    Volume,
    VolumeException,
    VolumeNotFoundException,
)

from tests.support.live_fixtures import point_sdk, started
from tests.support.live_server import LiveServer

VOLUME_MB = 16
TEAM_MB = 40  # room for two volumes of VOLUME_MB, not three
MIB = 1 << 20
# What a file system's own allocation may round a sparse image's host blocks up by.
HOST_SLACK = 256 << 10

Made = tuple[Callable[..., Volume], Callable[..., Sandbox]]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with started(
        VOLUME_MAX_MB=str(VOLUME_MB), VOLUME_MAX_MB_PER_TEAM=str(TEAM_MB), API_RATE_LIMIT="0"
    ) as live:
        yield live


@pytest.fixture
def sdk(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    """The SDK pointed at the server as ``scripts/serve.sh`` prints it, as the team
    ``contract``; the volume content calls go to the data plane."""
    point_sdk(monkeypatch, server, server.api_key)
    monkeypatch.setenv("E2B_VOLUME_API_URL", server.sandbox_url)
    return server


@pytest.fixture
def made(sdk: LiveServer) -> Iterator[Made]:
    """``volume(name?, api_key=...)`` and ``sandbox(**create kwargs)``, each removed at
    teardown: the sandboxes first (a volume they mount cannot go), then the volumes, so
    that every test starts with the team's whole budget."""
    volumes: list[tuple[str, dict[str, Any]]] = []
    sandboxes: list[str] = []

    def volume(name: str | None = None, **opts: Any) -> Volume:
        vol = Volume.create(name or f"q-{uuid.uuid4().hex[:12]}", **opts)
        volumes.append((vol.volume_id, opts))
        return vol

    def sandbox(**kwargs: Any) -> Sandbox:
        kwargs.setdefault("timeout", 120)
        sbx = Sandbox.create(**kwargs)
        sandboxes.append(sbx.sandbox_id)
        return sbx

    yield volume, sandbox
    for sandbox_id in sandboxes:
        Sandbox.kill(sandbox_id)
    for volume_id, opts in volumes:
        Volume.destroy(volume_id, **opts)


def host_volume_ids(server: LiveServer) -> set[str]:
    root = server.sandbox_root / "volumes"
    return {p.name for p in root.iterdir() if not p.name.startswith(".")}


def test_a_full_volume_is_enospc_in_the_guest_bounded_on_the_host_and_a_clear_sdk_error(
    sdk: LiveServer, made: Made
) -> None:
    volume, sandbox = made
    vol = volume()
    vol.write_file("/keep.txt", "the file before")
    sbx = sandbox(volume_mounts={"/mnt/data": vol})

    # The guest's user writes twice the volume's size: the volume is full, not the host.
    with pytest.raises(CommandExitException) as filled:
        sbx.commands.run(
            f"dd if=/dev/zero of=/mnt/data/big bs=1M count={2 * VOLUME_MB}", user="user"
        )
    assert "No space left on device" in filled.value.stderr, filled.value.stderr
    written = int(sbx.commands.run("stat -c %s /mnt/data/big").stdout)
    assert VOLUME_MB // 2 * MIB < written < VOLUME_MB * MIB
    sbx.commands.run("sync")

    # On the host: one sparse image of the volume's size, allocating no more than that.
    image = sdk.sandbox_root / "volumes" / vol.volume_id / "volume.img"
    st = os.stat(image)
    assert st.st_size == VOLUME_MB * MIB
    allocated = st.st_blocks * 512
    assert written <= allocated <= VOLUME_MB * MIB + HOST_SLACK, allocated

    # Room again in the guest; then an upload of twice the volume through the content API.
    sbx.commands.run("rm /mnt/data/big", user="user")
    with pytest.raises(VolumeException) as refused:
        vol.write_file("/keep.txt", b"\xa5" * (2 * VOLUME_MB * MIB), force=True)
    message = str(refused.value)
    assert message.startswith("507: ") and "not enough space in the volume" in message, message
    # The file it would have replaced is intact, and nothing of the upload is left.
    assert vol.read_file("/keep.txt") == "the file before"
    assert sbx.files.read("/mnt/data/keep.txt") == "the file before"
    assert [e.name for e in vol.list("/")] == ["keep.txt"]
    # Its space was given back: a write that fits works.
    vol.write_file("/fits.bin", b"\x5a" * (VOLUME_MB // 2 * MIB))
    assert sbx.commands.run("stat -c %s /mnt/data/fits.bin").stdout.strip() == str(
        VOLUME_MB // 2 * MIB
    )


def test_a_create_past_the_teams_budget_is_a_clear_400_and_makes_nothing(
    sdk: LiveServer, made: Made
) -> None:
    volume, _ = made
    first, second = volume(), volume()
    before = host_volume_ids(sdk)
    name = f"q-over-{uuid.uuid4().hex[:8]}"
    with pytest.raises(VolumeException) as refused:
        volume(name)
    message = str(refused.value)
    assert message.startswith(f"400: the team's volumes may allocate at most {TEAM_MB} MB"), message
    assert f"{2 * VOLUME_MB} MB are allocated" in message, message
    listed = {(v.volume_id, v.name) for v in Volume.list()}
    assert listed == {(first.volume_id, first.name), (second.volume_id, second.name)}
    assert host_volume_ids(sdk) == before == {first.volume_id, second.volume_id}
    # The name was not taken either: once there is room, it is free.
    assert Volume.destroy(second.volume_id) is True
    assert volume(name).name == name


def test_another_team_cannot_see_read_delete_mount_or_reach_a_volumes_content(
    sdk: LiveServer, made: Made
) -> None:
    volume, sandbox = made
    other: dict[str, Any] = {"api_key": sdk.other_api_key}
    vol = volume()
    vol.write_file("/secret.txt", "the first team's")
    own = volume(**other)  # the other team's own volume, within its own budget

    assert {v.volume_id for v in Volume.list(**other)} == {own.volume_id}
    assert vol.volume_id in {v.volume_id for v in Volume.list()}
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id, **other)
    with pytest.raises(VolumeNotFoundException):
        Volume.connect(vol.volume_id, **other)
    assert Volume.destroy(vol.volume_id, **other) is False  # the SDK's answer to a 404

    # Mounting it by its name is an invalid mount for that team, and makes no sandbox.
    for mount in (vol.name, vol):
        with pytest.raises(SandboxException, match="400: invalid mounts") as bad:
            sandbox(volume_mounts={"/mnt/theirs": mount}, **other)
        assert f"volume '{vol.name}' not found" in str(bad.value)
    listed = httpx.get(
        f"{sdk.url}/v2/sandboxes", headers={"X-API-Key": sdk.other_api_key}, timeout=30
    )
    assert listed.status_code == 200 and listed.json() == [], listed.text

    # Its own volume's token opens its own volume only.
    assert own.token
    stolen = Volume(vol.volume_id, vol.name, token=own.token)
    with pytest.raises(AuthenticationException, match="401"):
        stolen.read_file("/secret.txt")
    with pytest.raises(AuthenticationException, match="401"):
        stolen.write_file("/secret.txt", "overwritten")
    with pytest.raises(AuthenticationException, match="401"):
        stolen.list("/")

    # Nothing of it changed for its team: there, readable and mountable.
    assert vol.read_file("/secret.txt") == "the first team's"
    mine = sandbox(volume_mounts={"/mnt/data": vol.name})
    assert mine.files.read("/mnt/data/secret.txt") == "the first team's"
