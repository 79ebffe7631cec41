"""Files inside a local sandbox, opened by the host with ``openat2(RESOLVE_IN_ROOT)``
against the sandbox's root (``/proc/<init>/root``): the kernel resolves every component,
symlinks and ``..`` included, as if the guest's root were ``/``, so no guest-made link can
lead to a host file; magic links (``/proc/<pid>/root`` and friends) are refused outright,
and so is any operation on the guest's procfs, sysfs or cgroupfs (they are the host
kernel's). Every operation runs on a thread whose file-system ids are the guest user's
(``setfsuid`` drops the host's file capabilities), so the kernel checks the user's
permissions and what is created is owned by the user — the answers the user would get
from inside. The system calls are in syscalls.py, the guest's accounts in accounts.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

from e2bfacade.runtime.base import EntryInfo, FileType, GuestFileError
from e2bfacade.runtime.local.guest.accounts import host_id, id_names, lookup_user, name_of
from e2bfacade.runtime.local.guest.syscalls import as_guest_user, fs_type, openat2

MAX_DEPTH = 64  # the deepest list_dir

# File systems a file operation must never touch, even inside the guest's tree: the
# host's kernel interfaces (the guest's /proc, /sys and cgroupfs are the host kernel's).
FORBIDDEN_FS = {0x9FA0: "proc", 0x62656572: "sysfs", 0x27E0EB: "cgroup", 0x63677270: "cgroup2"}

# Of those, the ones whose files a user may read in the guest, as on a machine of its own:
# the host hands such a read to the guest (KernelFile).
GUEST_READABLE_FS = {"proc", "sysfs"}


class KernelFile(GuestFileError):
    """``path`` is a file of the guest's /proc or /sys: the host kernel's interfaces, which
    a host thread must never open for a guest (there /proc/self would be the host's, and
    reading may have effects). EPERM for every file operation but a read, which the guest
    itself makes as the user (the driver's read_file)."""

    def __init__(self, path: str, fs: str) -> None:
        super().__init__(errno.EPERM, f"{path}: file operations on {fs} are refused")
        self.path = path


def kernel_path(path: str) -> bool:
    """Whether the normalised guest ``path`` is under the guest's /proc or /sys."""
    return path.split("/", 2)[1] in ("proc", "sys")


def _check_fs(fd: int, path: str) -> None:
    fs = FORBIDDEN_FS.get(fs_type(fd) or 0)
    if fs is not None:
        if fs in GUEST_READABLE_FS:
            raise KernelFile(path, fs)
        raise GuestFileError(errno.EPERM, f"{path}: file operations on {fs} are refused")


METADATA_PREFIX = "user.e2b."
METADATA_MAX_BYTES = 4096


def _read_metadata(dir_fd: int, name: str) -> dict[str, str]:
    """A regular file's ``user.e2b.*`` attributes (empty where it cannot be read)."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return {}
    try:
        out = {}
        total = 0
        for attr in os.listxattr(fd):
            if attr.startswith(METADATA_PREFIX):
                value = os.getxattr(fd, attr)[:METADATA_MAX_BYTES]
                total += len(value)
                if total > 4 * METADATA_MAX_BYTES:
                    break  # a guest that set more itself: what fits is shown
                out[attr[len(METADATA_PREFIX) :]] = value.decode(errors="replace")
        return out
    except OSError:
        return {}
    finally:
        os.close(fd)


def _set_metadata(fd: int, metadata: Mapping[str, str]) -> None:
    """Make the file's ``user.e2b.*`` attributes exactly ``metadata`` (replace semantics)."""
    for attr in os.listxattr(fd):
        if attr.startswith(METADATA_PREFIX) and attr[len(METADATA_PREFIX) :] not in metadata:
            os.removexattr(fd, attr)
    for key, value in metadata.items():
        os.setxattr(fd, METADATA_PREFIX + key, value.encode())


def guest_path(path: str, home: str) -> str:
    """An absolute, normalised guest path: relative ones (and ``~``) are under ``home``."""
    if "\0" in path:
        raise GuestFileError(errno.EINVAL, "a path may not contain a NUL byte")
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]
    if not path.startswith("/"):
        path = f"{home.rstrip('/')}/{path}"
    parts: list[str] = []
    for part in PurePosixPath(path).parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


class GuestFiles:
    """File operations in one sandbox as one guest user. Use as a context manager; every
    method must run on the thread that entered it (the fs ids are per thread)."""

    def __init__(self, root: int, user: str, id_base: int) -> None:
        """``root``: an O_PATH descriptor of the guest's root (open_guest_root), which this
        object owns from here on; ``id_base``: the host id of the guest's id 0."""
        self.id_base = id_base
        self._root = root
        try:
            self.account = lookup_user(self._root, user)
            self._names = id_names(self._root)
        except BaseException:
            os.close(self._root)
            raise
        self._ids: contextlib.AbstractContextManager[None] | None = None

    def __enter__(self) -> GuestFiles:
        # The guest's ids are host ids id_base + n: work as that host id, so the kernel checks
        # the user's permissions and what is created is the user's.
        self._ids = as_guest_user(
            host_id(self.id_base, self.account.uid),
            host_id(self.id_base, self.account.gid),
            guest_root=self.account.uid == 0,
        )
        self._ids.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._ids is not None
        self._ids.__exit__(*exc)
        os.close(self._root)

    def path(self, path: str) -> str:
        return guest_path(path, self.account.home)

    def _open(self, path: str, flags: int, mode: int = 0) -> int:
        fd = openat2(self._root, path, flags, mode)
        try:
            _check_fs(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _parent(self, path: str) -> Iterator[tuple[int, str]]:
        """The directory holding ``path`` (resolved in the guest) and the last component."""
        if path == "/":
            raise GuestFileError(errno.EBUSY, "/: the root cannot be changed")
        parent, name = path.rsplit("/", 1)
        fd = self._open(parent or "/", os.O_PATH | os.O_DIRECTORY)
        try:
            yield fd, name
        finally:
            os.close(fd)

    def _entry(self, path: str, st: os.stat_result, target: str | None) -> EntryInfo:
        if stat.S_ISLNK(st.st_mode):
            kind = FileType.SYMLINK
        elif stat.S_ISDIR(st.st_mode):
            kind = FileType.DIRECTORY
        elif stat.S_ISREG(st.st_mode):
            kind = FileType.FILE
        else:
            kind = FileType.OTHER
        users, groups = self._names
        return EntryInfo(
            name=path.rsplit("/", 1)[1] or "/",
            path=path,
            type=kind,
            size=st.st_size,
            mode=st.st_mode,
            owner=name_of(users, st.st_uid - self.id_base),
            group=name_of(groups, st.st_gid - self.id_base),
            modified_time=st.st_mtime,
            symlink_target=target,
        )

    def _lstat_in(self, dir_fd: int, name: str, path: str) -> EntryInfo:
        try:
            st = os.stat(name or ".", dir_fd=dir_fd, follow_symlinks=False)
            target = os.readlink(name, dir_fd=dir_fd) if stat.S_ISLNK(st.st_mode) else None
        except OSError as exc:
            raise GuestFileError(exc.errno or errno.EIO, f"{path}: {exc.strerror}") from None
        entry = self._entry(path, st, target)
        if stat.S_ISREG(st.st_mode) and name:
            meta = _read_metadata(dir_fd, name)
            if meta:
                entry = dataclasses.replace(entry, metadata=meta)
        return entry

    def stat(self, path: str) -> EntryInfo:
        path = self.path(path)
        if path == "/":
            fd = self._open("/", os.O_PATH | os.O_DIRECTORY)
            try:
                return self._entry("/", os.fstat(fd), None)
            finally:
                os.close(fd)
        with self._parent(path) as (fd, name):
            return self._lstat_in(fd, name, path)

    def list_dir(self, path: str, depth: int = 1) -> list[EntryInfo]:
        path = self.path(path)
        if not 1 <= depth <= MAX_DEPTH:
            raise GuestFileError(errno.EINVAL, f"depth must be between 1 and {MAX_DEPTH}")
        fd = self._open(path, os.O_RDONLY | os.O_DIRECTORY)
        out: list[EntryInfo] = []
        # Depth first, names in order (as envd's WalkDir lists them), with an explicit stack
        # of (directory fd, its path, its level, the names left): a deep guest tree cannot
        # exhaust ours.
        stack: list[tuple[int, str, int, list[str]]] = []
        try:
            stack.append((fd, path, 1, sorted(os.listdir(fd), reverse=True)))
            while stack:
                dir_fd, dir_path, level, names = stack[-1]
                if not names:
                    os.close(dir_fd)
                    stack.pop()
                    continue
                name = names.pop()
                child = f"{dir_path.rstrip('/')}/{name}"
                try:
                    entry = self._lstat_in(dir_fd, name, child)
                except GuestFileError as exc:
                    if exc.errno == errno.ENOENT:
                        continue  # gone meanwhile: skipped, as envd skips it
                    raise
                out.append(entry)
                if entry.type is not FileType.DIRECTORY or level >= depth:
                    continue
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                except OSError:
                    continue  # unreadable: listed, not descended into
                try:
                    _check_fs(sub, child)
                    below = sorted(os.listdir(sub), reverse=True)
                except (GuestFileError, OSError):
                    os.close(sub)
                    continue  # the guest's /proc and /sys, or unreadable: listed, not walked
                stack.append((sub, child, level + 1, below))
        finally:
            for dir_fd, _, _, _ in stack:
                os.close(dir_fd)
        return out

    def make_dir(self, path: str) -> bool:
        path = self.path(path)
        parts = [p for p in path.split("/") if p]
        current = "/"
        created = False
        for part in parts:
            with self._parent(f"{current.rstrip('/')}/{part}") as (fd, name):
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    created = True
                except FileExistsError:
                    # Follow what is there (a symlink, say) inside the guest, never on the
                    # host: it must be, or lead to, a directory.
                    os.close(
                        self._open(f"{current.rstrip('/')}/{part}", os.O_PATH | os.O_DIRECTORY)
                    )
                    created = False
                except OSError as exc:
                    raise GuestFileError(
                        exc.errno or errno.EIO, f"{path}: {exc.strerror}"
                    ) from None
            current = f"{current.rstrip('/')}/{part}"
        return created

    def move(self, source: str, destination: str) -> EntryInfo:
        source, destination = self.path(source), self.path(destination)
        with (
            self._parent(source) as (src_fd, src_name),
            self._parent(destination) as (dst_fd, dst_name),
        ):
            try:
                os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as exc:
                raise GuestFileError(exc.errno or errno.EIO, f"{source}: {exc.strerror}") from None
            return self._lstat_in(dst_fd, dst_name, destination)

    def remove(self, path: str) -> None:
        path = self.path(path)
        try:
            with self._parent(path) as (fd, name):
                _remove_tree(fd, name, path)
        except GuestFileError as exc:
            if exc.errno != errno.ENOENT:
                raise

    def open_read(self, path: str) -> int:
        """A descriptor for reading the regular file ``path``: the permission check happens
        here, so the caller may read it on any thread."""
        path = self.path(path)
        if kernel_path(path):  # not even opened: refused before any host open
            raise KernelFile(path, path.split("/", 2)[1])
        fd = self._open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise GuestFileError(errno.EISDIR, f"{path}: is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise GuestFileError(errno.EINVAL, f"{path}: not a regular file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write(
        self, path: str, chunks: Iterable[bytes], metadata: Mapping[str, str] | None = None
    ) -> EntryInfo:
        path = self.path(path)
        parent = path.rsplit("/", 1)[0] or "/"
        self.make_dir(parent)
        with self._parent(path) as (dir_fd, name):
            try:
                fd = os.open(
                    name,
                    os.O_WRONLY
                    | os.O_CREAT
                    | os.O_TRUNC
                    | os.O_NOFOLLOW
                    | os.O_NONBLOCK
                    | os.O_CLOEXEC,
                    0o644,
                    dir_fd=dir_fd,
                )
            except OSError as exc:
                raise GuestFileError(exc.errno or errno.EIO, f"{path}: {exc.strerror}") from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise GuestFileError(errno.EINVAL, f"{path}: not a regular file")
                # As envd does: the file is (re-)chowned to the writer, which a watcher of
                # the directory sees as a chmod (where the user may; else it stays as it is).
                with contextlib.suppress(OSError):
                    uid = host_id(self.id_base, self.account.uid)
                    gid = host_id(self.id_base, self.account.gid)
                    os.fchown(fd, uid, gid)
                os.set_blocking(fd, True)
                for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                if metadata is not None:
                    _set_metadata(fd, metadata)
            except OSError as exc:
                raise GuestFileError(exc.errno or errno.EIO, f"{path}: {exc.strerror}") from None
            finally:
                os.close(fd)
            return self._lstat_in(dir_fd, name, path)


def _remove_tree(dir_fd: int, name: str, path: str) -> None:
    """Remove ``name`` in ``dir_fd``, recursively, without following symlinks and without
    recursion on the host's stack (a deep guest tree is walked with an explicit stack)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return
    except IsADirectoryError:
        pass
    except OSError as exc:
        if exc.errno != errno.EPERM:  # EPERM: unlink of a directory on some file systems
            raise GuestFileError(exc.errno or errno.EIO, f"{path}: {exc.strerror}") from None
    # (directory fd, name of the directory within its parent, parent fd)
    stack: list[tuple[int, str, int]] = []
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        top = os.open(name, flags, dir_fd=dir_fd)
        stack.append((top, name, dir_fd))
        device = os.fstat(top).st_dev
        _check_fs(top, path)
        while stack:
            fd, dname, pfd = stack[-1]
            sub = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
            if sub is not None:
                child = os.open(sub, flags, dir_fd=fd)
                stack.append((child, sub, fd))
                if os.fstat(child).st_dev != device:
                    # Another file system mounted inside the tree (the guest's /proc, a
                    # bind): never empty it from here.
                    raise GuestFileError(errno.EBUSY, f"{path}: contains a mount point")
                continue
            stack.pop()
            os.close(fd)
            os.rmdir(dname, dir_fd=pfd)
    except OSError as exc:
        raise GuestFileError(exc.errno or errno.EIO, f"{path}: {exc.strerror}") from None
    finally:
        for fd, _, _ in stack:
            os.close(fd)
