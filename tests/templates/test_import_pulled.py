"""A pulled image made a runtime image, on a real local runtime (scratch root): sandboxes
of it run commands as root and as ``user``, with the image's owners and environment; device
nodes, FIFOs and sockets are left out instead of failing the import."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from e2bfacade.runtime.base import SandboxSpec
from e2bfacade.runtime.local import LocalRuntime
from templates.builds.images import image_id_for, import_pulled
from templates.builds.registry import Pulled, pull
from tests.runtime.helpers import run

PROBE = "id; cat /etc/os-release"


def _sandbox(rt: LocalRuntime, image_id: str) -> str:
    sid = f"t{uuid.uuid4().hex[:12]}"
    rt.create(SandboxSpec(sandbox_id=sid, image_id=image_id, memory_mb=256))
    return sid


@pytest.mark.parametrize("ref", ["debian:bookworm", "e2bdev/base", "ubuntu:22.04"])
def test_a_pulled_image_runs_commands_as_root_and_as_user(
    ref: str, registry_url: str, shared_pull_cache: Path, local_runtime: LocalRuntime
) -> None:
    pulled = pull(ref, auth=None, mirror=registry_url, cache_dir=shared_pull_cache, team_id=1)
    image_id = image_id_for(pulled)
    info = import_pulled(local_runtime, image_id, pulled)
    assert info.image_id == image_id and info.parent is None and info.size_bytes > 10_000_000
    sid = _sandbox(local_runtime, image_id)
    try:
        as_root = run(local_runtime, sid, ["/bin/bash", "-lc", PROBE], user="root")
        assert as_root.exit_code == 0, as_root
        out = as_root.stdout.decode()
        assert out.startswith("uid=0(root) gid=0(root)")
        assert "VERSION_CODENAME=bookworm" in out and "Debian GNU/Linux 12" in out
        as_user = run(
            local_runtime, sid, ["/bin/bash", "-lc", PROBE], user="user", cwd="/home/user"
        )
        assert as_user.exit_code == 0, as_user
        assert as_user.stdout.decode().startswith("uid=1000(user) gid=1000(user)")
        # The home the import made from /etc/skel, the user's; the image's owners kept.
        checks = run(
            local_runtime,
            sid,
            # not a login shell: Debian's /etc/profile sets a PATH of its own
            [
                "/bin/bash",
                "-c",
                "stat -c '%U %a' ~ ~/.bashrc /usr/bin/sudo; stat -c %G /etc/shadow; echo $PATH",
            ],
            user="user",
        )
        lines = checks.stdout.decode().splitlines()
        assert lines[:4] == ["user 755", "user 644", "root 4755", "shadow"], checks
        assert lines[4] == pulled.env["PATH"]
        if ref == "e2bdev/base":
            tools = run(
                local_runtime,
                sid,
                ["/bin/bash", "-lc", "python --version; git --version; jq --version"],
            )
            assert tools.exit_code == 0, tools
            assert tools.stdout.decode().startswith("Python 3.11.")
    finally:
        local_runtime.kill(sid)


def test_an_image_of_the_same_id_is_kept(
    registry_url: str, shared_pull_cache: Path, local_runtime: LocalRuntime
) -> None:
    pulled = pull(
        "debian:bookworm", auth=None, mirror=registry_url, cache_dir=shared_pull_cache, team_id=1
    )
    first = import_pulled(local_runtime, image_id_for(pulled), pulled)
    started = time.monotonic()
    again = import_pulled(local_runtime, image_id_for(pulled), pulled)
    assert again == first and time.monotonic() - started < 1


def test_device_nodes_fifos_and_sockets_are_left_out(
    tmp_path: Path, local_runtime: LocalRuntime
) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "dev").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (rootfs / "etc/motd").write_text("hello\n")
    os.mknod(rootfs / "dev/null", 0o666 | 0o020000, os.makedev(1, 3))
    os.mkfifo(rootfs / "etc/fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(rootfs / "etc/sock"))
    listener.close()
    pulled = Pulled(
        ref="docker.io/library/handmade:latest",
        digest="sha256:" + "0" * 64,
        key="0" * 64,
        rootfs=rootfs,
        env={},
        user="",
        workdir="",
        cmd=(),
        entrypoint=(),
        compressed_bytes=0,
        cached=True,
    )
    image_id = f"handmade-{uuid.uuid4().hex[:8]}"
    import_pulled(local_runtime, image_id, pulled)
    made = local_runtime.layout.image_dir(image_id) / "rootfs"
    assert (made / "etc/motd").read_text() == "hello\n"
    assert not any(os.path.lexists(made / p) for p in ("dev/null", "etc/fifo", "etc/sock"))
    assert (made / "dev").is_dir() and (made / "home/user").is_dir()
    assert local_runtime.images.read(image_id).env["PATH"].startswith("/usr/local/sbin:")
