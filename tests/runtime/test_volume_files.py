"""The host's file operations on a volume (LocalVolumeFiles), against real directories: what a
guest that plants symlinks, hard links, FIFOs, sockets, device nodes, mount points or huge
sparse files in a volume can make the host do. Each hostile case has a file *outside* the
volume that must stay unread and unchanged, or an operation that must not hang."""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import FileType, GuestFileError
from e2bfacade.runtime.local.storage.volume_files import LocalVolumeFiles

SECRET = b"the host's secret\n"


@pytest.fixture
def place(tmp_path: Path) -> tuple[Path, Path]:
    """(the volume's root, a directory beside it holding ``secret``)."""
    root = tmp_path / "vol"
    root.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    return root, outside


@pytest.fixture
def vol(place: tuple[Path, Path]) -> LocalVolumeFiles:
    return LocalVolumeFiles(place[0])


def errno_of(fn: object, *args: object, **kwargs: object) -> int:
    with pytest.raises(GuestFileError) as caught:
        result = fn(*args, **kwargs)  # type: ignore[operator]
        if isinstance(result, Iterator):
            b"".join(result)
    return caught.value.errno


def read(vol: LocalVolumeFiles, path: str) -> bytes:
    return b"".join(vol.read_file(path))


def within(seconds: float, fn: object, *args: object) -> object:
    """``fn(*args)`` on a thread; fails the test (instead of hanging it) past ``seconds``."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} did not return within {seconds}s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


# ------------------------------------------------------------------ the plain operations
def test_write_read_stat_list_remove(vol: LocalVolumeFiles, place: tuple[Path, Path]) -> None:
    entry = vol.write_file("/d/e/f.txt", [b"hello ", b"world"], force=True, uid=1000, gid=1000)
    assert (entry.name, entry.path, entry.type, entry.size) == ("f.txt", "/d/e/f.txt", "file", 11)
    assert (entry.uid, entry.gid, entry.mode) == (1000, 1000, 0o644)
    assert isinstance(entry.mtime, float) and abs(entry.mtime - time.time()) < 60
    assert read(vol, "/d/e/f.txt") == b"hello world"
    # Parents made by force: the caller's ids, mode 0755.
    parent = vol.stat("/d")
    assert (parent.type, parent.uid, parent.mode) == (FileType.DIRECTORY, 1000, 0o755)
    assert [e.path for e in vol.list_dir("/")] == ["/d"]
    assert [e.path for e in vol.list_dir("/", depth=3)] == ["/d", "/d/e", "/d/e/f.txt"]
    assert vol.stat("/").path == "/" and vol.stat("/").name == "/"
    vol.remove("/d")
    assert os.listdir(place[0]) == []
    assert errno_of(vol.stat, "/d") == errno.ENOENT
    assert errno_of(vol.remove, "/d") == errno.ENOENT
    assert errno_of(vol.remove, "/") == errno.EBUSY


def test_force_semantics_as_e2b(vol: LocalVolumeFiles) -> None:
    vol.write_file("/a.txt", [b"one"])
    # Without force an existing file is not replaced, with it it is.
    assert errno_of(vol.write_file, "/a.txt", [b"two"]) == errno.EEXIST
    assert read(vol, "/a.txt") == b"one"
    vol.write_file("/a.txt", [b"two"], force=True)
    assert read(vol, "/a.txt") == b"two"
    # Without force a missing parent is ENOENT; a directory is never replaced by a file.
    assert errno_of(vol.write_file, "/no/such/a.txt", [b"x"]) == errno.ENOENT
    vol.make_dir("/dir")
    assert errno_of(vol.write_file, "/dir", [b"x"], force=True) == errno.EISDIR
    assert errno_of(vol.make_dir, "/dir") == errno.EEXIST
    assert vol.make_dir("/dir", force=True).type is FileType.DIRECTORY
    assert errno_of(vol.make_dir, "/x/y") == errno.ENOENT
    made = vol.make_dir("/x/y", force=True, uid=1000, gid=1000, mode=0o700)
    assert (made.uid, made.gid, made.mode) == (1000, 1000, 0o700)
    assert errno_of(vol.make_dir, "/a.txt/sub", force=True) == errno.ENOTDIR
    assert errno_of(vol.make_dir, "/a.txt", force=True) == errno.EEXIST
    # Relative paths are under the root, and "~" is a name like any other.
    assert vol.write_file("~", [b"tilde"]).path == "/~"
    assert vol.stat("dir").path == "/dir"


def test_ids_and_modes_are_bounded(vol: LocalVolumeFiles) -> None:
    for bad in (-1, 65536, 2**32, True):
        assert errno_of(vol.write_file, "/f", [b""], uid=bad) == errno.EINVAL
        assert errno_of(vol.make_dir, "/g", gid=bad) == errno.EINVAL
    assert errno_of(vol.write_file, "/f", [b""], mode=2**32) == errno.EINVAL
    # Only the permission bits are applied (E2B's os.ModePerm): no setuid file.
    entry = vol.write_file("/f", [b""], mode=0o4755)
    assert entry.mode == 0o755
    # Without ids: the guest's user (who owns the volume's root), as a sandbox's user writes.
    assert (entry.uid, entry.gid) == (1000, 1000)
    assert (vol.make_dir("/g").uid, vol.make_dir("/h", uid=0).gid) == (1000, 1000)
    updated = vol.update("/f", uid=1000, gid=1001, mode=0o600)
    assert (updated.uid, updated.gid, updated.mode) == (1000, 1001, 0o600)
    assert errno_of(vol.update, "/f", uid=70000) == errno.EINVAL
    assert errno_of(vol.update, "/nope", mode=0o600) == errno.ENOENT


def test_a_cut_write_leaves_the_old_file_and_nothing_else(
    vol: LocalVolumeFiles, place: tuple[Path, Path]
) -> None:
    vol.write_file("/keep.txt", [b"old content"])

    def body() -> Iterator[bytes]:
        yield b"new partial"
        raise GuestFileError(errno.ECONNRESET, "the client went away")

    with pytest.raises(GuestFileError):
        vol.write_file("/keep.txt", body(), force=True)
    assert read(vol, "/keep.txt") == b"old content"
    assert os.listdir(place[0]) == ["keep.txt"]  # no temporary file left behind


def test_list_dir_depth_bounds_and_order(vol: LocalVolumeFiles) -> None:
    for name in ("b", "a", "c"):
        vol.write_file(f"/top/{name}/x", [b""], force=True)
    assert [e.path for e in vol.list_dir("/top")] == ["/top/a", "/top/b", "/top/c"]
    assert [e.path for e in vol.list_dir("/top", depth=2)] == [
        "/top/a",
        "/top/a/x",
        "/top/b",
        "/top/b/x",
        "/top/c",
        "/top/c/x",
    ]
    assert errno_of(vol.list_dir, "/top", depth=0) == errno.EINVAL
    assert errno_of(vol.list_dir, "/top", depth=11) == errno.EINVAL
    assert errno_of(vol.list_dir, "/top/a/x") == errno.ENOTDIR
    assert errno_of(vol.list_dir, "/none") == errno.ENOENT


# ------------------------------------------------------------------ planted symlinks
def test_absolute_relative_and_dotdot_symlinks_stay_inside(
    vol: LocalVolumeFiles, place: tuple[Path, Path]
) -> None:
    root, outside = place
    secret = outside / "secret"
    os.symlink(secret, root / "abs")
    os.symlink("../outside/secret", root / "rel")
    os.symlink("../../../../../../../../..", root / "up")
    for path in ("/abs", "/rel", "/up" + str(secret), "/../outside/secret", "/up/../outside"):
        assert errno_of(vol.read_file, path) in (errno.ENOENT, errno.EISDIR), path
    # What an absolute link names is found inside the volume.
    inner = root / str(secret).lstrip("/")
    inner.parent.mkdir(parents=True)
    inner.write_bytes(b"the volume's own file")
    assert read(vol, "/abs") == b"the volume's own file"
    assert secret.read_bytes() == SECRET


def test_symlink_loops_fail_fast(vol: LocalVolumeFiles, place: tuple[Path, Path]) -> None:
    root = place[0]
    os.symlink("b", root / "a")
    os.symlink("a", root / "b")
    os.symlink("self/x", root / "self")
    for fn, args in (
        (vol.read_file, ("/a",)),
        (vol.list_dir, ("/a",)),
        (vol.write_file, ("/self/x/f", [b""])),
        (vol.make_dir, ("/a/d",)),
    ):
        with pytest.raises(GuestFileError) as caught:
            within(5, fn, *args)
        assert caught.value.errno == errno.ELOOP
    assert vol.stat("/a").type is FileType.SYMLINK and vol.stat("/a").target == "b"


def test_a_directory_symlink_out_leads_nowhere(
    vol: LocalVolumeFiles, place: tuple[Path, Path]
) -> None:
    root, outside = place
    os.symlink(outside, root / "d")
    assert errno_of(vol.write_file, "/d/new", [b"x"]) == errno.ENOENT
    assert errno_of(vol.write_file, "/d/new", [b"x"], force=True) == errno.ENOENT
    assert errno_of(vol.make_dir, "/d/sub", force=True) == errno.ENOENT
    assert errno_of(vol.list_dir, "/d") == errno.ENOENT
    assert errno_of(vol.update, "/d/secret", mode=0o777) == errno.ENOENT
    assert errno_of(vol.remove, "/d/secret") == errno.ENOENT
    assert sorted(os.listdir(outside)) == ["secret"]
    assert stat.S_IMODE(os.stat(outside / "secret").st_mode) == 0o644


def test_writes_chmod_chown_remove_never_follow_the_last_symlink(
    vol: LocalVolumeFiles, place: tuple[Path, Path]
) -> None:
    root, outside = place
    secret = outside / "secret"
    before = os.stat(secret)
    os.symlink(secret, root / "link")
    # The symlink's own owner changes, never the target's; its mode cannot be set.
    assert vol.update("/link", uid=1000, gid=1000).type is FileType.SYMLINK
    assert errno_of(vol.update, "/link", mode=0o777) == errno.EOPNOTSUPP
    after = os.stat(secret)
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )
    assert os.lstat(root / "link").st_uid == 1000
    # A write replaces the symlink itself.
    vol.write_file("/link", [b"mine"], force=True)
    assert not os.path.islink(root / "link") and read(vol, "/link") == b"mine"
    # A remove removes the symlink, and a tree holding a symlink to a directory out of
    # the volume is removed without walking it.
    os.symlink(secret, root / "link2")
    vol.remove("/link2")
    vol.make_dir("/tree")
    os.symlink(outside, root / "tree" / "out")
    vol.remove("/tree")
    assert secret.read_bytes() == SECRET and sorted(os.listdir(outside)) == ["secret"]


def test_a_write_never_goes_into_a_hard_linked_inode(
    vol: LocalVolumeFiles, place: tuple[Path, Path]
) -> None:
    root, outside = place
    os.link(outside / "secret", root / "hard")
    vol.write_file("/hard", [b"overwritten"], force=True)
    assert (outside / "secret").read_bytes() == SECRET
    assert read(vol, "/hard") == b"overwritten"


# ------------------------------------------------------------------ special files
def test_fifos_sockets_and_devices_are_never_opened(
    vol: LocalVolumeFiles, place: tuple[Path, Path]
) -> None:
    root = place[0]
    os.mkfifo(root / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "sock"))
        os.mknod(root / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's
        for name in ("fifo", "sock", "zero"):
            with pytest.raises(GuestFileError) as caught:
                within(5, vol.read_file, f"/{name}")
            assert caught.value.errno == errno.EINVAL, name
            assert vol.stat(f"/{name}").type is FileType.OTHER
        # Replacing one never opens it either (a FIFO would block the writer).
        within(5, lambda: vol.write_file("/fifo", [b"now a file"], force=True))
        assert read(vol, "/fifo") == b"now a file"


def test_a_huge_sparse_file_is_read_in_bounded_chunks(
    vol: LocalVolumeFiles, place: tuple[Path, Path]
) -> None:
    with open(place[0] / "sparse", "wb") as f:
        f.truncate(1 << 40)  # 1 TiB of holes
    assert vol.stat("/sparse").size == 1 << 40
    reader = vol.read_file("/sparse", chunk_size=1 << 16)
    sizes = [len(next(reader)) for _ in range(64)]
    assert sizes == [1 << 16] * 64
    reader.close()  # type: ignore[attr-defined]
    assert list(reader) == []


def test_a_mount_point_inside_is_not_crossed(
    vol: LocalVolumeFiles, place: tuple[Path, Path]
) -> None:
    root, outside = place
    (root / "m").mkdir()
    subprocess.run(["mount", "--bind", str(outside), str(root / "m")], check=True)
    try:
        assert errno_of(vol.read_file, "/m/secret") == errno.EXDEV
        assert errno_of(vol.write_file, "/m/new", [b"x"]) == errno.EXDEV
        assert [e.path for e in vol.list_dir("/", depth=3)] == ["/m"]
        assert errno_of(vol.remove, "/m") == errno.EBUSY
    finally:
        subprocess.run(["umount", "-l", str(root / "m")], check=True)
    assert sorted(os.listdir(outside)) == ["secret"]


def test_a_full_volume_is_enospc_and_keeps_the_old_file(tmp_path: Path) -> None:
    image, mnt = tmp_path / "vol.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(8 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        vol = LocalVolumeFiles(mnt)
        vol.write_file("/f", [b"before"])
        chunk = b"\xab" * (1 << 20)
        with pytest.raises(GuestFileError) as caught:
            vol.write_file("/f", (chunk for _ in range(32)), force=True)
        assert caught.value.errno == errno.ENOSPC
        assert read(vol, "/f") == b"before"
        assert sorted(os.listdir(mnt)) == ["f", "lost+found"]
        vol.write_file("/g", [b"room again"])  # the failed write's blocks were freed
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
