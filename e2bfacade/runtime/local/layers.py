"""Archives of an overlay's writable layer, and rootfs import.

A snapshot is the tar of a sandbox's upper directory, kept exactly as overlayfs wrote it:
deletions are whiteouts (character devices 0/0) and replaced directories carry the
``trusted.overlay.opaque`` xattr. Extracted, the archive is a valid overlay lower layer, so
a sandbox restored from it sees the same files, deletions included. Python's tarfile keeps
device nodes but not xattrs, so the opaque marker travels as a GNU-tar-style PAX record.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

OPAQUE_XATTR = "trusted.overlay.opaque"
PAX_OPAQUE = "SCHILY.xattr." + OPAQUE_XATTR


def archive_layer(upper: Path, dest: Path) -> None:
    """Write ``upper`` to the tar ``dest`` (via a temp file: a crash leaves no partial archive)."""
    tmp = dest.with_name(dest.name + ".part")

    def keep_opaque(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if info.isdir():
            try:
                value = os.getxattr(upper / info.name, OPAQUE_XATTR)
            except OSError:
                value = b""
            if value == b"y":
                info.pax_headers = {**info.pax_headers, PAX_OPAQUE: "y"}
        return info

    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(os.listdir(upper)):
            tar.add(upper / entry, arcname=entry, filter=keep_opaque)
    os.replace(tmp, dest)


def _rootfs_filter(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo:
    """tarfile's 'tar' filter (no absolute paths, nothing outside ``dest``, no link that
    leaves it) without its mode rewrite: a root file system needs its setuid bits."""
    checked = tarfile.tar_filter(member, dest_path)
    if member.islnk():
        # A hard link's target is another member: relative to the archive root, always.
        linkname = member.linkname.lstrip("/")
        root = os.path.realpath(dest_path)
        target = os.path.realpath(os.path.join(root, linkname))
        if os.path.commonpath([target, root]) != root:
            raise tarfile.LinkOutsideDestinationError(member, target)
        if not os.path.lexists(os.path.join(root, linkname)):
            raise tarfile.TarError(f"hard link {member.name!r} to missing member {linkname!r}")
        checked = checked.replace(linkname=linkname, deep=False)
    if member.isdev() and not (member.ischr() and member.devmajor == member.devminor == 0):
        # Only overlay whiteouts (0/0); a real device node would bypass the guest's
        # missing CAP_MKNOD.
        raise tarfile.SpecialFileError(member)
    return checked.replace(mode=member.mode, deep=False)


def extract_layer(archive: Path, dest: Path) -> None:
    """Extract an archive made by :func:`archive_layer` (or a rootfs tarball) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        tar.extractall(dest, members=members, numeric_owner=True, filter=_rootfs_filter)
        for m in members:
            if m.pax_headers.get(PAX_OPAQUE) == "y":
                os.setxattr(dest / m.name, OPAQUE_XATTR, b"y")


def tree_size(path: Path) -> int:
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total
