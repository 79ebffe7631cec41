"""The host runtime's images: read-only lower layers under ``images/<id>/``, each with a
parent (a snapshot's parent is the image its sandbox ran), published by rename so readers
never see half an image.

``base`` is built here from the host: its ``/usr`` (and ``/bin``, ``/lib*``) bound
read-only, over a fresh ``/etc`` skeleton and an empty ``/home/user`` — never the host's
``/etc``, ``/root``, ``/home`` or ``/var``.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from e2bfacade.runtime.base import (
    BUILTIN_IMAGE,
    CreateRefused,
    ImageBuild,
    ImageInfo,
    ImageNotFound,
)
from e2bfacade.runtime.local.atomic import write_json as state_write_json
from e2bfacade.runtime.local.build import CLEAN_ENV
from e2bfacade.runtime.local.state import Layout
from e2bfacade.runtime.local.storage import homes, layers, trees
from e2bfacade.runtime.local.storage.image_meta import ImageMeta, env_of, start_of, workdir_of

BASE_IMAGE = BUILTIN_IMAGE
GUEST_USER_UID = 1000
# These /etc entries are copied because programs need them and they hold nothing secret
# (alternatives symlinks, the dynamic linker cache, public CA certs).
HOST_ETC_COPIES = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl/certs",
    "profile",
    "bash.bashrc",
    "nsswitch.conf",
    "localtime",
    "os-release",
    "debian_version",
    # PAM's configuration (no secrets: the modules and policies Debian ships), so sudo and
    # su work inside; the guest's own sudoers is written below.
    "pam.d",
    "security",
    "login.defs",
)
BASE_DIRS = (
    "usr",
    "etc",
    "home",
    "root",
    "tmp",
    "var/tmp",
    "var/log",
    "var/cache",
    "var/lib",
    "opt",
    "mnt",
    "srv",
    "proc",
    "sys",
    "dev",
    "run",
)
# Mount points the runtime needs in every image, made at import so they never land in a
# sandbox's writable layer (and so in its snapshots); the default user's home likewise
# (homes.py).
MOUNT_POINTS = ("proc", "sys", "dev", "run", "tmp")

# Fills a new image's directory (its rootfs/ made empty), returning what it is made of;
# publish() records its size, xattr namespace and time.
Builder = Callable[[Path], ImageMeta]


class ImageStore:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def _read_json(self, image_id: str) -> dict[str, Any]:
        try:
            return json.loads((self.layout.image_dir(image_id) / "image.json").read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            raise ImageNotFound(f"image {image_id!r} does not exist") from None

    def read(self, image_id: str) -> ImageMeta:
        return ImageMeta.from_json(image_id, self._read_json(image_id))

    def read_or_none(self, image_id: str) -> ImageMeta | None:
        try:
            return self.read(image_id)
        except ImageNotFound:
            return None

    def info(self, image_id: str) -> ImageInfo:
        meta = self.read(image_id)
        return ImageInfo(
            image_id=image_id,
            parent=meta.parent,
            size_bytes=meta.size,
            created_at=meta.created,
            start=start_of(self.chain(image_id)),
        )

    def exists(self, image_id: str) -> bool:
        return (self.layout.image_dir(image_id) / "image.json").exists()

    def chain(self, image_id: str) -> builtins.list[ImageMeta]:
        """The image and its ancestors, top layer first."""
        chain: builtins.list[ImageMeta] = []
        current: str | None = image_id
        while current is not None:
            meta = self.read(current)
            chain.append(meta)
            current = meta.parent
        return chain

    def layer(self, image_id: str) -> Path:
        """The image's files: a lower layer of its sandboxes' root."""
        return self.layout.image_dir(image_id) / "rootfs"

    def chain_ids(self, image_id: str) -> builtins.list[str]:
        try:
            return [m.image_id for m in self.chain(image_id)]
        except ImageNotFound:
            return [image_id]

    def list(self) -> list[str]:
        return sorted(
            p.name
            for p in (self.layout.root / "images").iterdir()
            if not p.name.startswith(".") and (p / "image.json").exists()
        )

    def children(self, image_id: str) -> builtins.list[str]:
        return [
            name
            for name in self.list()
            if name != image_id and (m := self.read_or_none(name)) and m.parent == image_id
        ]

    def publish(self, image_id: str, build: Builder) -> ImageInfo:
        """Build an image in a temp dir and rename it into place: readers never see half."""
        final = self.layout.image_dir(image_id)
        with self.layout.locked("image", image_id):
            if (final / "image.json").exists():
                return self.info(image_id)
            tmp = final.with_name(f".{image_id}.building")
            _remove_quietly(tmp)
            (tmp / "rootfs").mkdir(parents=True)
            try:
                meta = dataclasses.replace(
                    build(tmp),
                    image_id=image_id,
                    size=trees.tree_size(tmp / "rootfs"),
                    xattrs="user",
                    created=time.time(),
                )
                (tmp / "image.json").write_text(json.dumps(meta.to_json()))
                _remove_quietly(final)
                os.rename(tmp, final)
            except BaseException:
                _remove_quietly(tmp)
                raise
        return self.info(image_id)

    def squash(self, image_id: str, new_id: str, *, max_bytes: int) -> ImageInfo:
        """Image ``new_id``: ``image_id``'s files flattened into one layer (the kernel's
        merged view of its chain, mounted read-only, copied), with the chain's host binds,
        environment and start command: a chain made shallow, so that layer upon layer of
        builds never reaches the launcher's limit of descriptors per sandbox."""
        chain = self.chain(image_id)
        if len(chain) == 1:
            return self.info(image_id)
        lowers = [str(self.layer(m.image_id)) for m in chain]

        def make(tmp: Path) -> ImageMeta:
            merged = tmp / "merged"
            merged.mkdir()
            subprocess.run(
                [
                    "mount", "-t", "overlay", "overlay", "-o",
                    f"ro,lowerdir={':'.join(lowers)},userxattr,redirect_dir=nofollow",
                    str(merged),
                ],
                check=True, capture_output=True, env=CLEAN_ENV,
            )  # fmt: skip
            try:
                (tmp / "rootfs").rmdir()
                trees.copy_layer(merged, tmp / "rootfs", max_bytes=max_bytes)
            finally:
                subprocess.run(["umount", str(merged)], check=True, env=CLEAN_ENV)
                merged.rmdir()
            binds: list[str] = []
            for meta in chain:
                binds += [b for b in meta.host_binds if b not in binds]
            return ImageMeta(
                new_id,
                host_binds=tuple(binds),
                env=env_of(chain),
                start=start_of(chain),
                workdir=workdir_of(chain),
            )

        return self.publish(new_id, make)

    def remove(self, image_id: str) -> None:
        """Delete the image's files. Caller holds its lock and checked nothing uses it."""
        final = self.layout.image_dir(image_id)
        tomb = final.with_name(f".{image_id}.deleting")
        os.rename(final, tomb)
        trees.remove_tree(tomb)

    def migrate_xattrs(self) -> None:
        """Images made before sandboxes had user namespaces mark opaque directories with
        ``trusted.overlay.opaque``; the sandboxes' userxattr overlays read the ``user.``
        name. Mark them so, once per image (recorded in its image.json)."""
        for image_id in self.list():
            try:  # as a dict: rewritten with every key it has, known to this code or not
                meta = self._read_json(image_id)
            except ImageNotFound:
                continue
            if meta.get("xattrs") == "user":
                continue
            rootfs = self.layout.image_dir(image_id) / "rootfs"
            trees.mark_user_opaque(rootfs)
            meta["xattrs"] = "user"
            state_write_json(self.layout.image_dir(image_id) / "image.json", meta)

    def ensure_base(self) -> ImageInfo:
        if self.exists(BASE_IMAGE):
            return self.info(BASE_IMAGE)
        return self.publish(BASE_IMAGE, _build_base)

    def build(self, spec: ImageBuild) -> ImageInfo:
        """An image made by ``spec.populate`` on top of ``spec.parent`` (see ImageBuild)."""
        if spec.parent is not None:
            self.read(spec.parent)  # ImageNotFound before anything is made

        def make(tmp: Path) -> ImageMeta:
            spec.populate(tmp / "rootfs")
            if spec.parent is None:  # a whole root file system, finished as an import's
                finish_root(tmp / "rootfs")
            return ImageMeta(
                spec.image_id,
                parent=spec.parent,
                env=dict(spec.env),
                start=spec.start,
                workdir=spec.workdir or None,
            )

        return self.publish(spec.image_id, make)

    def import_archive(self, image_id: str, archive: IO[bytes]) -> ImageInfo:
        """A rootfs tarball (read from ``archive``) becomes image ``image_id``. Unsafe
        members (absolute paths, ``..``, links out of the tree, device nodes, FIFOs) are
        refused, and nothing is left of a refused archive. The image gets the default
        user's account and home if the tarball has none (homes.py)."""
        spool = self.layout.root / "run" / f".import-{image_id}-{os.getpid()}.tar"

        def make(tmp: Path) -> ImageMeta:
            layers.extract_layer(spool, tmp / "rootfs")
            finish_root(tmp / "rootfs")
            return ImageMeta(image_id)

        try:
            with open(spool, "wb") as out:
                shutil.copyfileobj(archive, out)
            return self.publish(image_id, make)
        except (OSError, ValueError, tarfile.TarError) as exc:
            raise CreateRefused(f"cannot import the archive: {exc}") from exc
        finally:
            spool.unlink(missing_ok=True)


def finish_root(rootfs: Path) -> None:
    """Make a root file system (an archive's, or a parentless build's) an image's: the
    runtime's mount points, and the default user's account and home if it has none."""
    # Never through a symlink: the tree's links point into the guest's tree, not the host's.
    for d in MOUNT_POINTS:
        p = rootfs
        for part in Path(d).parts:
            p = p / part
            if p.is_symlink() or (p.exists() and not p.is_dir()):
                raise CreateRefused(f"/{d} in the archive is not a directory")
            if not p.exists():
                p.mkdir()
    homes.ensure_default_user(rootfs)


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        trees.remove_tree(path)


def _build_base(tmp: Path) -> ImageMeta:
    rootfs = tmp / "rootfs"
    binds = ["/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():  # merged-/usr hosts: /bin -> usr/bin
            os.symlink(os.readlink(host), rootfs / top)
        elif host.is_dir():
            binds.append(str(host))
    for d in BASE_DIRS:
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    os.chmod(rootfs / "tmp", 0o1777)
    os.chmod(rootfs / "var/tmp", 0o1777)
    os.chmod(rootfs / "root", 0o700)
    home = rootfs / "home/user"
    home.mkdir()
    os.chown(home, GUEST_USER_UID, GUEST_USER_UID)
    etc = rootfs / "etc"
    for name in HOST_ETC_COPIES:
        src = Path("/etc") / name
        dst = etc / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dst)
    uid = GUEST_USER_UID
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\n"
        f"user:x:{uid}:{uid}:user:/home/user:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nsudo:x:27:user\nuser:x:{uid}:\nnogroup:x:65534:\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\nuser:*:19000:0:99999:7:::\n")
    os.chmod(etc / "shadow", 0o640)
    # As in E2B's templates: the default user may become (guest) root without a password.
    sudoers = etc / "sudoers"
    sudoers.write_text(
        "Defaults env_reset\n"
        'Defaults secure_path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n'
        "root ALL=(ALL:ALL) ALL\n"
        "user ALL=(ALL:ALL) NOPASSWD: ALL\n"
    )
    os.chmod(sudoers, 0o440)
    (etc / "hostname").write_text("e2b\n")
    (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
    (etc / "resolv.conf").write_text("")
    return ImageMeta(BASE_IMAGE, host_binds=tuple(binds))
