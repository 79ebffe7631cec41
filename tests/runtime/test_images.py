"""Templates from rootfs tarballs, and input the runtime must refuse without leaving debris."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
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
from e2bfacade.runtime.local.storage import homes
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
    buried(runtime)
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
    assert runtime.images.read(tpl).host_binds == ()  # nothing of the host's

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


SPECIAL_MEMBERS = [
    (tarfile.CHRTYPE, 1, 3, "a character device (1, 3)"),
    (tarfile.BLKTYPE, 8, 0, "a block device (8, 0)"),
    (tarfile.FIFOTYPE, 0, 0, "a FIFO"),
]


@pytest.mark.parametrize(
    ("kind", "major", "minor", "said"), SPECIAL_MEMBERS, ids=["char device", "block device", "fifo"]
)
def test_a_tar_with_a_device_node_or_fifo_is_refused_naming_it_and_leaves_nothing(
    runtime: LocalRuntime, tmp_path: Path, kind: bytes, major: int, minor: int, said: str
) -> None:
    # The guest lacks CAP_MKNOD so that it cannot make device nodes; a template tarball
    # must not hand it one either (any device the host has: disks, /dev/kmsg, /dev/mem...).
    # A FIFO would stall the import: a later member of its name is written through it.
    archive = tmp_path / "special.tar"
    with tarfile.open(archive, "w") as tar:
        add_dir(tar, "etc")
        add_file(tar, "etc/motd", b"before the node\n")
        node = tarfile.TarInfo("dev/smuggled")
        node.type = kind
        node.devmajor, node.devminor = major, minor
        node.mode = 0o666
        tar.addfile(node)
        add_file(tar, "dev/smuggled", b"written through it\n")
    before = debris(runtime)
    tpl = image_id()
    with pytest.raises(CreateRefused) as refused:
        import_tar(runtime, tpl, archive)
    assert f"member 'dev/smuggled' is {said}" in refused.value.message
    assert debris(runtime) == before
    assert not any(tpl in name for name in os.listdir(runtime.root / "images"))


# ---------------------------------------------------------------- the default user's home
def add_host_path(tar: tarfile.TarFile, path: str, added: set[str]) -> None:
    """The host's file ``path`` at the same place in ``tar``, with its directories and
    every symlink on the way (merged /usr, the dynamic loader's links) as the host has
    them."""
    parts = Path(path).parts[1:]
    here = "/"
    for i, part in enumerate(parts):
        here = os.path.join(here, part)
        if os.path.islink(here):
            if here not in added:
                added.add(here)
                add_link(tar, here.lstrip("/"), os.readlink(here))
            target = os.path.normpath(os.path.join(os.path.dirname(here), os.readlink(here)))
            add_host_path(tar, os.path.join(target, *parts[i + 1 :]), added)
            return
        if here not in added:
            added.add(here)
            if i < len(parts) - 1:
                add_dir(tar, here.lstrip("/"))
            else:
                tar.add(here, arcname=here.lstrip("/"), recursive=False)


def host_tools_rootfs(archive: Path, etc: dict[str, bytes]) -> None:
    """A rootfs of the host's bash and coreutils (with their libraries) and ``etc``:
    nothing else of the host's, no /home."""
    found = {p: shutil.which(p) for p in ("bash", "ls", "touch", "id", "cat")}
    programs = [path for path in found.values() if path is not None]
    assert len(programs) == len(found), found
    needed = set(programs)
    for program in programs:
        out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True)
        needed |= {w for w in out.stdout.split() if w.startswith("/")}
    added: set[str] = set()
    with tarfile.open(archive, "w") as tar:
        for d in ("etc", "tmp"):
            add_dir(tar, d)
        for name, data in etc.items():
            parent = os.path.dirname(name)
            if parent and parent not in added:
                added.add(parent)
                add_dir(tar, parent)
            add_file(tar, name, data)
        for path in sorted(needed):
            add_host_path(tar, str(path), added)


SKEL = {
    "etc/skel/.bashrc": b"# the image's own bashrc\n",
    "etc/skel/.profile": b"# the image's own profile\n",
    "etc/skel/.config/app/settings": b"theme=dark\n",
}
ROOT_ONLY = {"etc/passwd": b"root:x:0:0:root:/root:/bin/bash\n", "etc/group": b"root:x:0:\n"}
WITH_USER = {
    "etc/passwd": b"root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n",
    "etc/group": b"root:x:0:\nuser:x:1000:\n",
}


@pytest.mark.parametrize("accounts", [ROOT_ONLY, WITH_USER], ids=["no user", "user, no home"])
def test_an_imported_rootfs_gives_the_default_user_a_home_from_its_skel(
    runtime: LocalRuntime, sandbox_id: str, tmp_path: Path, accounts: dict[str, bytes]
) -> None:
    archive = tmp_path / "rootfs.tar"
    host_tools_rootfs(archive, {**accounts, **SKEL})
    tpl = image_id()
    import_tar(runtime, tpl, archive)
    try:
        runtime.create(SandboxSpec(sandbox_id, tpl))
        script = "echo $HOME; id -u; ls -la ~; touch ~/x && ls -l ~/x; cat ~/.config/app/settings"
        result = run(runtime, sandbox_id, ["bash", "-c", script], user="user")
        assert result.exit_code == 0, result
        lines = result.stdout.decode().splitlines()
        assert lines[:2] == ["/home/user", "1000"], lines
        listing = {line.split()[-1]: line.split() for line in lines if line.startswith(("d", "-"))}
        for name in (".", ".bashrc", ".profile", ".config"):
            assert listing[name][2:4] == ["user", "user"], listing
        assert listing["."][0] == "drwxr-xr-x", listing
        assert any(line.endswith(" /home/user/x") and " user user " in line for line in lines)
        assert lines[-1] == "theme=dark"
        bashrc = run(runtime, sandbox_id, ["cat", "/home/user/.bashrc"], user="user")
        assert bashrc.stdout == SKEL["etc/skel/.bashrc"]
    finally:
        runtime.kill(sandbox_id)
        runtime.delete_image(tpl)


def test_an_image_keeps_its_own_accounts_and_home_and_a_taken_uid_1000_is_not_shared(
    tmp_path: Path,
) -> None:
    own = tmp_path / "own"
    (own / "etc").mkdir(parents=True)
    (own / "home/user").mkdir(parents=True)
    (own / "home/user/.mine").write_text("kept\n")
    (own / "etc/passwd").write_text("user:x:1234:1234::/home/user:/bin/sh\n")
    homes.ensure_default_user(own)
    assert (own / "etc/passwd").read_text() == "user:x:1234:1234::/home/user:/bin/sh\n"
    assert sorted(os.listdir(own / "home/user")) == [".mine"]
    assert (own / "home/user").stat().st_uid == os.getuid()  # as the image made it

    taken = tmp_path / "taken"
    (taken / "etc").mkdir(parents=True)
    (taken / "etc/passwd").write_text("ubuntu:x:1000:1000::/home/ubuntu:/bin/sh")
    (taken / "etc/group").write_text("ubuntu:x:1000:\n")
    homes.ensure_default_user(taken)
    passwd = (taken / "etc/passwd").read_text().splitlines()
    assert passwd[-1] == "user:x:1001:1001:user:/home/user:/bin/sh", passwd
    assert (taken / "etc/group").read_text().splitlines()[-1] == "user:x:1001:"
    home = (taken / "home/user").stat()
    assert (home.st_uid, home.st_gid, oct(home.st_mode & 0o7777)) == (1001, 1001, "0o755")
