"""Templates from rootfs tarballs, and input the runtime must refuse without leaving debris."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from pathlib import Path

import pytest

from e2bfacade.runtime.base import (
    CreateRefused,
    ImageInfo,
    ImageNotFound,
    InvalidId,
    SandboxRuntimeError,
    SandboxSpec,
)
from e2bfacade.runtime.local import LocalRuntime
from tests.runtime.helpers import buried, cgroup_dirs, run


def import_tar(runtime: LocalRuntime, image: str, archive: Path) -> ImageInfo:
    with open(archive, "rb") as f:
        return runtime.import_image(image, f)


def image_id() -> str:
    return f"tpl-{uuid.uuid4().hex[:10]}"


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def add_link(tar: tarfile.TarFile, name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    tar.addfile(info)


def add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def debris(runtime: LocalRuntime) -> tuple[set[str], set[str], set[str]]:
    """Everything a refused call could have left behind: sandbox dirs, groups, images
    (once earlier tests' killed sandboxes are gone)."""
    assert buried(runtime)
    return (
        set(os.listdir(runtime.root / "sandboxes")),
        runtime.cgroups.list_ids(),
        set(os.listdir(runtime.root / "images")),
    )


# ---------------------------------------------------------------------------- import
def test_an_imported_rootfs_runs_its_own_static_binary(
    runtime: LocalRuntime, sandbox_id: str, static_probe: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        for d in ("bin", "etc", "tmp"):
            add_dir(tar, d)
        add_file(tar, "bin/hello", static_probe.read_bytes(), mode=0o755)
        add_file(tar, "etc/motd", b"imported\n")
    tpl = image_id()
    info = import_tar(runtime, tpl, archive)
    assert info.parent is None and info.size_bytes > 0
    assert runtime.images.read(tpl)["host_binds"] == []  # nothing of the host's

    runtime.create(SandboxSpec(sandbox_id, tpl))
    result = run(runtime, sandbox_id, ["/bin/hello"])
    assert (result.exit_code, result.stdout) == (0, b"hello from a static binary\n"), result
    # No host /usr in an imported template: it has exactly what its tarball had.
    assert run(runtime, sandbox_id, ["/bin/hello", "/usr/bin/env"]).exit_code == 1
    assert run(runtime, sandbox_id, ["/bin/hello", "/etc/motd"]).stdout == b"read 9\n"

    runtime.kill(sandbox_id)
    assert runtime.delete_image(tpl) is True
    assert not (runtime.root / "images" / tpl).exists()


def test_creating_from_an_unknown_image_fails_and_leaves_nothing(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    before = debris(runtime)
    with pytest.raises(ImageNotFound):
        runtime.create(SandboxSpec(sandbox_id, "no-such-image"))
    assert debris(runtime) == before
    assert not (runtime.root / "sandboxes" / sandbox_id).exists()
    assert not any(d.exists() for d in cgroup_dirs(runtime, sandbox_id))


BAD_IDS = ["../x", "a/b", "", "a\x00b", "a" * 200, "a,b", "a:b", "a=b", ".hidden", "a\n"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_ids_that_are_not_url_safe_are_refused_and_make_nothing(
    runtime: LocalRuntime, bad: str
) -> None:
    before = debris(runtime)
    try:
        with pytest.raises(InvalidId):
            runtime.create(SandboxSpec(bad, "base"))
        with pytest.raises(InvalidId):
            runtime.snapshot("whatever", bad)
        with pytest.raises(InvalidId):
            runtime.kill(bad)
        with pytest.raises(InvalidId):
            runtime.status(bad)
        assert debris(runtime) == before
    finally:
        if debris(runtime) != before:  # clean up what a broken check let through
            for sid in debris(runtime)[0] - before[0]:
                runtime.kill(sid)


@pytest.mark.parametrize(
    ("cpu_count", "memory_mb", "pids_max"),
    [(2, 8, 64), (2, 64, 2), (0, 64, 64), (1000, 64, 64)],
    ids=["memory_mb=8", "pids_max=2", "cpu_count=0", "cpu_count=1000"],
)
def test_out_of_range_limits_are_refused_and_make_nothing(
    runtime: LocalRuntime, sandbox_id: str, cpu_count: int, memory_mb: int, pids_max: int
) -> None:
    before = debris(runtime)
    with pytest.raises(CreateRefused):
        runtime.create(SandboxSpec(sandbox_id, "base", cpu_count, memory_mb, pids_max))
    assert debris(runtime) == before


def test_a_tar_member_outside_the_rootfs_is_refused(
    runtime: LocalRuntime, tmp_path: Path, host_scratch: Path
) -> None:
    archive = tmp_path / "evil.tar"
    depth = "../" * 12
    with tarfile.open(archive, "w") as tar:
        add_file(tar, "ok", b"fine")
        add_file(tar, depth + str(host_scratch / "dotdot").lstrip("/"), b"escaped")
    before = debris(runtime)
    with pytest.raises(CreateRefused):
        import_tar(runtime, image_id(), archive)
    assert list(host_scratch.iterdir()) == []
    assert debris(runtime) == before


def test_a_tar_cannot_write_through_an_absolute_symlink(
    runtime: LocalRuntime, tmp_path: Path, host_scratch: Path
) -> None:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        add_link(tar, "escape", str(host_scratch))
        add_file(tar, "escape/planted", b"escaped")
    before = debris(runtime)
    with pytest.raises(CreateRefused):
        import_tar(runtime, image_id(), archive)
    assert list(host_scratch.iterdir()) == []
    assert debris(runtime) == before


def test_a_tar_hardlink_cannot_reach_a_host_file(
    runtime: LocalRuntime, tmp_path: Path, host_scratch: Path
) -> None:
    victim = host_scratch / "victim"
    victim.write_text("host secret\n")
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        add_link(tar, "abs", str(victim), kind=tarfile.LNKTYPE)
        add_link(tar, "rel", "../" * 12 + str(victim).lstrip("/"), kind=tarfile.LNKTYPE)
        add_file(tar, "abs", b"overwritten through the link\n")
    tpl = image_id()
    try:
        import_tar(runtime, tpl, archive)
    except SandboxRuntimeError:
        pass
    try:
        assert victim.read_text() == "host secret\n"
        assert victim.stat().st_nlink == 1, "the host file is hard-linked into the template"
    finally:
        if (runtime.root / "images" / tpl).exists():
            runtime.delete_image(tpl)


def test_a_symlinked_mount_point_in_a_tar_cannot_make_host_directories(
    runtime: LocalRuntime, tmp_path: Path, host_scratch: Path
) -> None:
    # import_image makes home/user in the new rootfs; with home -> /somewhere on the host
    # that must not become /somewhere/user.
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        add_link(tar, "home", str(host_scratch))
    tpl = image_id()
    try:
        import_tar(runtime, tpl, archive)
    except SandboxRuntimeError:
        pass
    try:
        assert list(host_scratch.iterdir()) == []
    finally:
        if (runtime.root / "images" / tpl).exists():
            runtime.delete_image(tpl)


def test_device_nodes_in_an_imported_rootfs_cannot_be_opened(
    runtime: LocalRuntime, sandbox_id: str, static_probe: Path, tmp_path: Path
) -> None:
    # The guest lacks CAP_MKNOD so that it cannot make device nodes; a template tarball
    # must not hand it one either (any device the host has: disks, /dev/kmsg, /dev/mem...).
    # /dev/null's numbers keep the probe harmless: it only has to be openable to fail.
    archive = tmp_path / "devices.tar"
    with tarfile.open(archive, "w") as tar:
        add_file(tar, "probe", static_probe.read_bytes(), mode=0o755)
        node = tarfile.TarInfo("smuggled")
        node.type = tarfile.CHRTYPE
        node.devmajor, node.devminor = 1, 3
        node.mode = 0o666
        tar.addfile(node)
    tpl = image_id()
    try:
        import_tar(runtime, tpl, archive)
    except SandboxRuntimeError:
        return  # refusing device nodes at import is fine too
    runtime.create(SandboxSpec(sandbox_id, tpl))
    result = run(runtime, sandbox_id, ["/probe", "/smuggled"])
    assert result.exit_code != 0, "a device node from the template was opened"
    # The runtime's own /dev still works.
    assert run(runtime, sandbox_id, ["/probe", "/dev/null"]).stdout == b"read 0\n"
