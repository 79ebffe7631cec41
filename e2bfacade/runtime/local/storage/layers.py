"""Root file system tarballs into image layers, with hardened extraction (no absolute
paths, nothing outside the destination, no link that leaves it, no device node but an
overlay whiteout, no FIFO). An archive may carry an overlay layer exactly: whiteouts (character
devices 0/0) and, as a GNU-tar-style PAX record, the overlay opaque xattr of a replaced
directory (``user.`` or ``trusted.``; it lands as ``user.overlay.opaque``, the name the
sandboxes' userxattr overlays read). Snapshots go through no archive: ``trees.copy_layer``.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

OPAQUE_XATTR = "user.overlay.opaque"  # sandboxes mount their overlays with userxattr
PAX_OPAQUE = "SCHILY.xattr." + OPAQUE_XATTR
PAX_OPAQUE_TRUSTED = "SCHILY.xattr.trusted.overlay.opaque"  # a layer archived by host root


class SpecialMember(tarfile.FilterError):
    """A device node or FIFO in an archive: refused, named, with what to do instead."""

    def __init__(self, member: tarfile.TarInfo) -> None:
        self.tarinfo = member
        if member.isfifo():
            kind = "a FIFO"
        else:
            device = "character" if member.ischr() else "block"
            kind = f"a {device} device ({member.devmajor}, {member.devminor})"
        super().__init__(
            f"member {member.name!r} is {kind}; a template carries no device node or FIFO "
            "(its sandboxes get the runtime's /dev): leave them out of the tarball, "
            "e.g. tar --exclude='./dev/*'"
        )


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
        # Only overlay whiteouts (0/0). A real device node would bypass the guest's missing
        # CAP_MKNOD; a FIFO would stall the import itself: a later member of the same name
        # is written through it, an open for writing that waits for a reader forever.
        raise SpecialMember(member)
    return checked.replace(mode=member.mode, deep=False)


def extract_layer(archive: Path, dest: Path) -> None:
    """Extract a rootfs tarball (or an overlay layer archive) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        tar.extractall(dest, members=members, numeric_owner=True, filter=_rootfs_filter)
        for m in members:
            if "y" in (m.pax_headers.get(PAX_OPAQUE), m.pax_headers.get(PAX_OPAQUE_TRUSTED)):
                os.setxattr(dest / m.name, OPAQUE_XATTR, b"y")
