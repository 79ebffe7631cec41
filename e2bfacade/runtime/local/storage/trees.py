"""Walking trees a guest made, with bounded host work.

A guest controls what is in its writable layer: 100 000-deep directories, FIFOs, sockets,
hard links, sparse files, names of any bytes. Python's ``shutil.rmtree``, ``os.walk`` and
``tarfile`` recurse (a deep tree raises ``RecursionError``), follow paths from the top
(``PATH_MAX`` ends them) or hold a descriptor per level (``EMFILE``). The walker here holds
**one** directory descriptor at a time: it descends with ``openat(name, O_NOFOLLOW)`` and
climbs with ``openat("..")``, checking each directory's identity (device and inode) against
what it recorded on the way down, so a directory moved under it ends the walk with
:class:`TreeChanged` instead of leading it elsewhere. It never follows a symlink and never
leaves the file system it started on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The overlay metadata a layer carries: sandboxes mount with userxattr (a user namespace may
# use only user.* xattrs), so an opaque directory is marked user.overlay.opaque.
OPAQUE_XATTRS = ("user.overlay.opaque",)
ID_RANGE = 65536
NOBODY = 65534
MAX_LINKED_FILES = 1024


class TreeChanged(OSError):
    """A directory was moved or replaced while the walk was in it."""


class TreeTooLarge(OSError):
    """The tree holds more than the caller allowed."""


@dataclass
class _Frame:
    fd: int
    ident: tuple[int, int]
    names: list[str]
    index: int = 0
    name_in_parent: str = ""


@dataclass
class Usage:
    bytes: int = 0  # allocated on disk: sparse files count what they use
    inodes: int = 0
    seen: set[tuple[int, int]] = field(default_factory=set)


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _open_dir(name: str, dir_fd: int | None, expect: os.stat_result | None = None) -> int:
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    if expect is not None and _ident(os.fstat(fd)) != _ident(expect):
        os.close(fd)
        raise TreeChanged(errno.ESTALE, f"{name} changed during the walk")
    return fd


class _Walk:
    """Depth-first over the tree at ``root`` with one open directory at a time.

    ``on_entry(dir_fd, name, st)`` is called for every entry that is not a directory to
    descend into (a directory of another file system is one). ``on_dir(dir_fd, name, st)``
    is called in the parent as a directory is entered and returns whether to enter it;
    ``on_leave(dir_fd, name, st)`` is called in the parent once it was left (post-order).
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def run(
        self,
        on_entry: Callable[[int, str, os.stat_result], None],
        on_dir: Callable[[int, str, os.stat_result], bool],
        on_leave: Callable[[int, str, os.stat_result], None],
        deadline: float | None = None,
    ) -> None:
        top = _open_dir(str(self.root), None)
        top_st = os.fstat(top)
        device = top_st.st_dev
        stack = [_Frame(top, _ident(top_st), sorted(os.listdir(top)))]
        # The stat of each directory on the stack, for on_leave in its parent.
        dir_stats: list[os.stat_result] = [top_st]
        try:
            while stack:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(errno.ETIMEDOUT, "the walk ran out of time")
                frame = stack[-1]
                if frame.index >= len(frame.names):
                    # Climb: leave this directory for its parent, checking it is the one
                    # we came from.
                    if len(stack) == 1:
                        break
                    parent = stack[-2]
                    up = os.open("..", DIR_FLAGS, dir_fd=frame.fd)
                    if _ident(os.fstat(up)) != parent.ident:
                        os.close(up)
                        raise TreeChanged(errno.ESTALE, f"{self.root}: moved during the walk")
                    os.close(frame.fd)
                    stack.pop()
                    left = dir_stats.pop()
                    parent.fd = up
                    on_leave(up, frame.name_in_parent, left)
                    continue
                name = frame.names[frame.index]
                frame.index += 1
                try:
                    st = os.stat(name, dir_fd=frame.fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode) and st.st_dev == device:
                    try:
                        child = _open_dir(name, frame.fd, st)
                    except FileNotFoundError:
                        continue
                    if not on_dir(frame.fd, name, st):
                        os.close(child)
                        continue
                    os.close(frame.fd)
                    frame.fd = -1
                    stack.append(_Frame(child, _ident(st), sorted(os.listdir(child)), 0, name))
                    dir_stats.append(st)
                    continue
                on_entry(frame.fd, name, st)
        finally:
            for frame in stack:
                if frame.fd >= 0:
                    os.close(frame.fd)


def remove_tree(path: Path) -> None:
    """Delete ``path`` and everything under it (missing is fine). Mount points inside it
    (the guest's /proc, a bind) are never entered: removing one fails as EBUSY."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink(missing_ok=True)
        return

    def entry(dir_fd: int, name: str, st: os.stat_result) -> None:
        if stat.S_ISDIR(st.st_mode):  # another file system's mount point
            raise OSError(errno.EBUSY, f"{name}: a mount point inside the tree")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)

    def leave(dir_fd: int, name: str, st: os.stat_result) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=dir_fd)

    _Walk(path).run(entry, lambda *_: True, leave)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def tree_usage(path: Path, *, deadline: float | None = None, into: Usage | None = None) -> Usage:
    """Bytes allocated and inodes used under ``path`` (hard links counted once). With
    ``into``, counts accumulate there, so a walk that raised still leaves its partial sum."""
    usage = into if into is not None else Usage()

    def count(dir_fd: int, name: str, st: os.stat_result) -> None:
        usage.inodes += 1
        if st.st_nlink > 1:
            if _ident(st) in usage.seen:
                return
            usage.seen.add(_ident(st))
        usage.bytes += st.st_blocks * 512

    def enter(dir_fd: int, name: str, st: os.stat_result) -> bool:
        count(dir_fd, name, st)
        return True

    _Walk(path).run(count, enter, lambda *_: None, deadline)
    return usage


def mark_user_opaque(path: Path) -> None:
    """Give every directory under ``path`` marked ``trusted.overlay.opaque`` the same mark
    as ``user.overlay.opaque`` (what a userxattr overlay reads)."""

    def enter(dir_fd: int, name: str, st: os.stat_result) -> bool:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        try:
            with contextlib.suppress(OSError):
                if os.getxattr(fd, "trusted.overlay.opaque") == b"y":
                    os.setxattr(fd, OPAQUE_XATTRS[0], b"y")
        finally:
            os.close(fd)
        return True

    _Walk(path).run(lambda *_: None, enter, lambda *_: None)


def tree_size(path: Path) -> int:
    """The bytes a tree holds on disk (what an image or a layer costs)."""
    return tree_usage(path).bytes


# ------------------------------------------------------------------------------ copying
def _copy_data(src: int, dst: int, limit: list[int]) -> None:
    """Copy a file's data extents only, so holes stay holes."""
    size = os.fstat(src).st_size
    offset = 0
    while offset < size:
        try:
            data = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                break
            raise
        hole = os.lseek(src, data, os.SEEK_HOLE)
        limit[0] -= hole - data
        if limit[0] < 0:
            raise TreeTooLarge(errno.EFBIG, "the layer is larger than the snapshot limit")
        position = data
        while position < hole:
            sent = _copy_range(src, dst, hole - position, position)
            if sent == 0:
                break
            position += sent
        offset = hole
    os.ftruncate(dst, size)


# Where the kernel cannot copy between the two file systems itself (a sandbox's disk and
# the image store are different ones), bytes go through a bounded buffer.
_CROSS_DEVICE = {errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS}
_BUFFER = 1 << 20


def _copy_range(src: int, dst: int, count: int, position: int) -> int:
    try:
        return os.copy_file_range(src, dst, count, position, position)
    except OSError as exc:
        if exc.errno not in _CROSS_DEVICE:
            raise
    data = os.pread(src, min(count, _BUFFER), position)
    view, done = memoryview(data), 0
    while done < len(data):
        done += os.pwrite(dst, view[done:], position + done)
    return len(data)


def _shifted(host_id: int, shift: int) -> int:
    """A sandbox's host id as the layer stores it: guest ids (0..65535). An id outside the
    sandbox's range (none should be) becomes nobody's."""
    guest = host_id + shift
    return guest if 0 <= guest < ID_RANGE else NOBODY


# What a layer copy keeps of a file's extended attributes: the user's own (``user.*``, the
# files API's ``user.e2b.*`` metadata among them) but overlay's bookkeeping of the mount the
# layer came from (``user.overlay.*`` other than opaque: origins of layers that are not
# there any more); file capabilities and POSIX ACLs with their ids shifted like the owners'.
# ``trusted.*`` and the other ``security.*`` names are the host's, never a guest's.
CAPABILITY = "security.capability"
ACLS = ("system.posix_acl_access", "system.posix_acl_default")
_CAPS_V3 = 0x03000000  # VFS_CAP_REVISION_3: rootid follows the two capability words
_ACL_USER, _ACL_GROUP = 0x02, 0x08


def _shifted_caps(value: bytes, shift: int) -> bytes | None:
    """A ``security.capability`` value for the copy. A v3 value names the user namespace
    root it applies to (rootid, a host id here): that becomes the same guest's id, as an
    owner does; one outside the sandbox's range applies to nobody and is left out."""
    if len(value) != 24 or int.from_bytes(value[:4], "little") & 0xFF000000 != _CAPS_V3:
        return value  # v2: no rootid
    guest = int.from_bytes(value[20:], "little") + shift
    if not 0 <= guest < ID_RANGE:
        return None
    return value[:20] + guest.to_bytes(4, "little")


def _shifted_acl(value: bytes, shift: int) -> bytes:
    """A POSIX ACL (a u32 version, then u16 tag, u16 perm, u32 id entries) with the ids of
    its named users and groups shifted."""
    out = bytearray(value)
    for at in range(4, len(out) - 7, 8):
        if int.from_bytes(out[at : at + 2], "little") in (_ACL_USER, _ACL_GROUP):
            host = int.from_bytes(out[at + 4 : at + 8], "little")
            out[at + 4 : at + 8] = _shifted(host, shift).to_bytes(4, "little")
    return bytes(out)


def _copied_xattr(name: str, value: bytes, shift: int) -> bytes | None:
    if name in OPAQUE_XATTRS:
        return value
    if name.startswith("user."):
        return None if name.startswith("user.overlay.") else value
    if name == CAPABILITY:
        return _shifted_caps(value, shift)
    if name in ACLS:
        return _shifted_acl(value, shift)
    return None


def _copy_xattrs(src: int, dst: int, shift: int) -> None:
    """Copy what a layer keeps of ``src``'s extended attributes to ``dst`` (descriptors).
    Call after the owner is set: a chown clears file capabilities."""
    for name in os.listxattr(src):
        value = _copied_xattr(name, os.getxattr(src, name), shift)
        if value is not None:
            os.setxattr(dst, name, value)


def copy_layer(src: Path, dst: Path, *, max_bytes: int, id_shift: int = 0) -> None:
    """Copy an overlay layer ``src`` into the new directory ``dst``, exactly: modes (setuid,
    setgid and sticky bits included), owners, times, whiteouts (character devices 0/0),
    opaque-directory xattrs, the user's xattrs, file capabilities and ACLs of files and
    directories, symlinks, FIFOs, sockets and hard links; sparse files stay sparse. Raises
    :class:`TreeTooLarge` past ``max_bytes`` of data. Device nodes other than whiteouts are
    left out: a guest cannot make them, and they would bypass its missing CAP_MKNOD in every
    restored sandbox.
    ``id_shift`` is added to every owner: a sandbox's layer holds host ids (its range's
    base + guest id), an image holds guest ids."""
    os.mkdir(dst, 0o755)
    budget = [max_bytes]
    # The destination is walked in step with the source, also holding one descriptor: the
    # last of dst_fds (the others are -1 once left for a child).
    dst_fds = [_open_dir(str(dst), None)]
    # Files with several names: (device, inode) in the source -> an O_PATH descriptor of
    # the copy, to link the next name to. Past MAX_LINKED_FILES of them, further names are
    # copied (the byte budget still bounds that).
    links: dict[tuple[int, int], int] = {}

    def make(dir_fd: int, name: str, st: os.stat_result) -> None:
        here = dst_fds[-1]
        mode = stat.S_IMODE(st.st_mode)
        kind = stat.S_IFMT(st.st_mode)
        if kind == stat.S_IFREG and st.st_nlink > 1 and _ident(st) in links:
            # Another name of a file already copied: link it again, as the source has it.
            os.link(f"/proc/self/fd/{links[_ident(st)]}", name, dst_dir_fd=here)
            return
        if kind == stat.S_IFREG:
            src_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                out = os.open(name, flags, 0o600, dir_fd=here)
                try:
                    _copy_data(src_fd, out, budget)
                    # Owner first (a chown clears file capabilities, setuid and setgid),
                    # then xattrs (an ACL sets the mode's group bits), then the mode, then
                    # the times (last: the rest bumps them).
                    os.fchown(out, _shifted(st.st_uid, id_shift), _shifted(st.st_gid, id_shift))
                    _copy_xattrs(src_fd, out, id_shift)
                    os.fchmod(out, mode)
                    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
                    if st.st_nlink > 1 and len(links) < MAX_LINKED_FILES:
                        links[_ident(st)] = os.open(
                            name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here
                        )
                finally:
                    os.close(out)
            finally:
                os.close(src_fd)
            return
        if kind == stat.S_IFLNK:
            os.symlink(os.readlink(name, dir_fd=dir_fd), name, dir_fd=here)
        elif kind == stat.S_IFCHR and st.st_rdev == 0:
            os.mknod(name, stat.S_IFCHR | mode, 0, dir_fd=here)  # a whiteout
        elif kind in (stat.S_IFIFO, stat.S_IFSOCK):
            os.mknod(name, kind | mode, 0, dir_fd=here)
        else:
            return
        os.chown(
            name,
            _shifted(st.st_uid, id_shift),
            _shifted(st.st_gid, id_shift),
            dir_fd=here,
            follow_symlinks=False,
        )
        if kind != stat.S_IFLNK:  # the umask trimmed mknod's mode
            os.chmod(name, mode, dir_fd=here)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=here, follow_symlinks=False)

    def enter(dir_fd: int, name: str, st: os.stat_result) -> bool:
        here = dst_fds[-1]
        os.mkdir(name, 0o700, dir_fd=here)
        child = _open_dir(name, here)
        # Hold only the new directory: climb back with "..", like the source walk.
        os.close(here)
        dst_fds[-1] = -1
        dst_fds.append(child)
        src_fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        try:
            _copy_xattrs(src_fd, child, id_shift)  # its owner is root's until leave
        finally:
            os.close(src_fd)
        return True

    def leave(dir_fd: int, name: str, st: os.stat_result) -> None:
        child = dst_fds.pop()
        os.fchown(child, _shifted(st.st_uid, id_shift), _shifted(st.st_gid, id_shift))
        os.fchmod(child, stat.S_IMODE(st.st_mode))
        os.utime(child, ns=(st.st_atime_ns, st.st_mtime_ns))
        up = os.open("..", DIR_FLAGS, dir_fd=child)
        os.close(child)
        dst_fds[-1] = up

    try:
        _Walk(src).run(make, enter, leave)
        top = os.lstat(src)
        os.chown(dst, _shifted(top.st_uid, id_shift), _shifted(top.st_gid, id_shift))
        os.chmod(dst, stat.S_IMODE(top.st_mode))
    finally:
        for fd in [*dst_fds, *links.values()]:
            if fd >= 0:
                os.close(fd)
