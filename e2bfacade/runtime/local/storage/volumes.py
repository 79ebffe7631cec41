"""Volumes on this host: each one a file system of its own, shared by the sandboxes that
mount it (see e2bfacade/runtime/volumes.py for what a volume is).

Layout::

    volumes/<id>/volume.img   a sparse ext4 image of the volume's size limit (0600)
    volumes/<id>/data/        where it is mounted on the host (nodev, nosuid, noatime)

Directories are root's, 0700. Locks: a volume's (``volume``) is held shared by each create
or boot that mounts it until the sandbox's record names it, and exclusively by its create,
its delete and :meth:`VolumeStore.release`; its mount lock (``volume-mount``), taken after
it, serialises the host mount and unmount. The file system's root directory is owned by the guest's
``user`` (1000:1000 on disk), 0755: files in a volume are stored with *guest* ids, as image
layers are, and each sandbox's mount maps them into its own id range (launcher/c/launch.c).
A guest, or the content API, that fills a volume meets ENOSPC (bytes or inodes); the host's
disk grows by at most the volume's size, however the volume is written.

The host mount is made lazily, under the volume's lock, by whoever needs it first (a
sandbox's create or boot, the content API): after a host reboot, a crash or a stop of the
service that unmounted it, the next use mounts it again (checked with ``e2fsck -p`` first
when it was not unmounted cleanly: storage/disks.py). Sandboxes hold clones of that mount, so
unmounting it on the host (:meth:`VolumeStore.release`) leaves running sandboxes as they
are.

A volume is made in a directory of its own name beginning with a dot and renamed into
place once formatted and mounted, so a crash never leaves a half-made volume under its id;
deleted the other way round (renamed away, then removed).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from e2bfacade.runtime.base import CreateRefused, check_id
from e2bfacade.runtime.local.storage import disks, trees
from e2bfacade.runtime.volumes import VolumeInfo, VolumeInUse, VolumeMount, VolumeNotFound

if TYPE_CHECKING:
    from e2bfacade.runtime.local.state import Layout

VOLUMES = "volumes"
IMAGE = "volume.img"
MOUNT = "data"
GUEST_USER = 1000  # the guest's ``user``: owns the volume's root directory
MIN_VOLUME_MB = 8
NO_SUBDIRS: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostMount:
    """A volume of a sandbox as a launcher mounts it: ``source``, its mount on the host, at
    ``target``, a guest path (each launcher turns it into its own form: the C launcher's
    request item, gVisor's bind in the root tree)."""

    source: Path
    target: str


class VolumeStore:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.root = layout.root / VOLUMES
        self.root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)

    def dir_of(self, volume_id: str) -> Path:
        return self.root / check_id(volume_id, "volume id")

    def mount_point(self, volume_id: str) -> Path:
        return self.dir_of(volume_id) / MOUNT

    def exists(self, volume_id: str) -> bool:
        return (self.dir_of(volume_id) / IMAGE).exists()

    def ids(self, *, made_before: float | None = None) -> set[str]:
        """The volumes' ids; with ``made_before``, only those made before then: by their
        directory's ctime, which the create's rename into place sets last (writes to the
        volume change its image, not the directory)."""
        found = set()
        with os.scandir(self.root) as entries:
            for e in entries:
                if e.name.startswith("."):
                    continue
                if made_before is not None:
                    try:
                        if e.stat(follow_symlinks=False).st_ctime >= made_before:
                            continue
                    except FileNotFoundError:  # deleted meanwhile
                        continue
                found.add(e.name)
        return found

    def create(self, volume_id: str, size_mb: int, max_mb: int) -> VolumeInfo:
        """Make the volume (idempotent by id: an existing one is returned as it is, with
        its own size) and mount it on the host."""
        d = self.dir_of(volume_id)
        if not isinstance(size_mb, int) or not MIN_VOLUME_MB <= size_mb <= max_mb:
            raise CreateRefused(
                f"a volume's size must be between {MIN_VOLUME_MB} and {max_mb} MB, got {size_mb}"
            )
        with self.layout.locked("volume", volume_id):
            if not (d / IMAGE).exists():
                tmp = self.root / f".{volume_id}.{secrets.token_hex(4)}.new"
                tmp.mkdir(mode=0o700)
                try:
                    disks.format_image(tmp / IMAGE, size_mb, root_owner=GUEST_USER)
                    # Its first mount, to make it as a guest meets it: no lost+found (e2fsck
                    # makes one again when a crash left it to repair), the root 0755.
                    # It stays mounted through the rename (a mount moves with its parent).
                    disks.mount_image(tmp / IMAGE, tmp / MOUNT, NO_SUBDIRS)
                    (tmp / MOUNT / "lost+found").rmdir()
                    os.chmod(tmp / MOUNT, 0o755)
                    with self.layout.locked("volume-mount", volume_id):
                        trees.remove_tree(d)  # a directory with no image: nothing of anyone
                        os.rename(tmp, d)
                except BaseException:
                    disks.unmount(tmp / MOUNT)
                    with contextlib.suppress(OSError):
                        trees.remove_tree(tmp)
                    raise
            self._mount_now(volume_id)
            return self._info(volume_id)

    @contextlib.contextmanager
    def held(self, mounts: tuple[VolumeMount, ...]) -> Iterator[list[HostMount]]:
        """Each volume of ``mounts`` mounted on the host, and held (its lock, shared) so that
        no delete takes it until the sandbox's record names it: a launch runs inside.
        CreateRefused for a volume that does not exist."""
        with contextlib.ExitStack() as stack:
            for volume_id in sorted({m.volume_id for m in mounts}):
                stack.enter_context(self.layout.locked("volume", volume_id, shared=True))
            held = []
            for mount in mounts:
                try:
                    source = self.ensure_mounted(mount.volume_id)
                except VolumeNotFound:
                    raise CreateRefused(f"volume {mount.volume_id} does not exist") from None
                held.append(HostMount(source, mount.path))
            yield held

    def ensure_mounted(self, volume_id: str) -> Path:
        """The volume's host mount point, mounted (lazily, once, under its mount lock: a
        caller may hold the volume's lock, shared or not). Raises VolumeNotFound when
        there is no such volume."""
        mount_point = self.mount_point(volume_id)
        if os.path.ismount(mount_point):
            return mount_point
        return self._mount_now(volume_id)

    def _mount_now(self, volume_id: str) -> Path:
        with self.layout.locked("volume-mount", volume_id):
            return self._mount(volume_id)

    def _unmount(self, volume_id: str, mount_point: Path) -> None:
        with self.layout.locked("volume-mount", volume_id):
            disks.unmount(mount_point)

    def _mount(self, volume_id: str) -> Path:
        d = self.dir_of(volume_id)
        if not (d / IMAGE).exists():
            raise VolumeNotFound(f"volume {volume_id} does not exist")
        disks.ensure_image_mounted(d / IMAGE, d / MOUNT, NO_SUBDIRS, force_check=False)
        return d / MOUNT

    def sync(self, volume_id: str) -> None:
        """Write the volume's dirty pages out (syncfs), if it is mounted on the host."""
        mount_point = self.mount_point(volume_id)
        if not os.path.ismount(mount_point):
            return
        disks.syncfs(mount_point)

    def info(self, volume_id: str) -> VolumeInfo:
        self.ensure_mounted(volume_id)
        return self._info(volume_id)

    def _info(self, volume_id: str) -> VolumeInfo:
        d = self.dir_of(volume_id)
        size_mb = (d / IMAGE).stat().st_size >> 20
        st = os.statvfs(d / MOUNT)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        return VolumeInfo(volume_id=volume_id, size_mb=size_mb, used_bytes=used)

    def delete(self, volume_id: str, users: Callable[[str], set[str]]) -> bool:
        """Delete the volume; False when there was none; VolumeInUse while ``users`` (the
        live sandboxes mounting it) names any. Under the volume's lock, which a create or
        boot that mounts it holds (shared) until its record is written: no sandbox gets a
        volume that is being deleted."""
        with self.layout.locked("volume", volume_id):
            if not self.dir_of(volume_id).exists():
                return False
            if found := users(volume_id):
                named = ", ".join(f"sandbox {u}" for u in sorted(found))
                raise VolumeInUse(f"volume {volume_id} is mounted by {named}")
            return self.remove(volume_id)

    def remove(self, volume_id: str) -> bool:
        """Unmount and delete the volume; False when there was none. Caller holds its lock
        and has checked that no live sandbox mounts it."""
        d = self.dir_of(volume_id)
        if not d.exists():
            return False
        existed = (d / IMAGE).exists()
        tomb = self.root / f".{volume_id}.{secrets.token_hex(4)}.deleting"
        with self.layout.locked("volume-mount", volume_id):
            disks.unmount(d / MOUNT)
            os.rename(d, tomb)
        bury(tomb)
        return existed

    def release(self) -> None:
        """Unmount every volume on the host (lazily: what still uses one keeps it until it
        lets go; the loop device then detaches itself). The next use mounts it again."""
        for volume_id in self.ids():
            with self.layout.locked("volume", volume_id):
                self._unmount(volume_id, self.mount_point(volume_id))
        for tomb in self.root.glob(".*.deleting"):
            bury(tomb)
        for new in self.root.glob(".*.new"):  # a create a crash cut short
            with self.layout.locked("volume", new.name[1:].rsplit(".", 2)[0]):
                if new.exists():
                    bury(new)


def bury(tomb: Path) -> None:
    """Remove a deleted (or half-made) volume's directory: its mount, then its files."""
    with contextlib.suppress(OSError):
        disks.unmount(tomb / MOUNT)
        with contextlib.suppress(FileNotFoundError):
            (tomb / IMAGE).unlink()
        trees.remove_tree(tomb)
