"""A volume's files as the host reaches them for E2B's volume content API
(:class:`~e2bfacade.runtime.volumes.VolumeFiles`), on the directory where the volume's
file system is mounted.

Every guest that mounts the volume may have planted anything in it: symlinks (absolute,
relative, ``..``, loops), hard links, FIFOs, sockets, device nodes, huge sparse files. So:

- every path is resolved with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
  RESOLVE_NO_XDEV)`` against the volume's root: symlinks and ``..`` never lead out of it,
  and no mount point inside it is crossed;
- the last component is never followed for a write, a chmod, a chown or a remove (they
  act on the name in its resolved parent, ``AT_SYMLINK_NOFOLLOW``);
- a read opens the file ``O_PATH`` first and reopens it only once ``fstat`` says it is a
  regular file: a FIFO, a socket or a device node is never opened (nothing blocks, no
  device is touched); a write replaces the name atomically (an unnamed ``O_TMPFILE`` in the
  same directory, linked in, then renamed over), so it never writes into an inode a hard
  link shares, and a cut upload leaves the old file;
- reads go in chunks (bounded memory whatever the file's size, sparse or not); writes are
  bounded by the volume's own file system (ENOSPC past its size).

Ids are guest ids (0 for root, 1000 for ``user``), stored as given: each sandbox's mount
maps them into its own id range. The host works as root on the volume's files, which are
its own file system's and no one else's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from e2bfacade.runtime.base import FileType, GuestFileError
from e2bfacade.runtime.local.guest.files import guest_path
from e2bfacade.runtime.local.guest.syscalls import RESOLVE_NO_XDEV, openat2
from e2bfacade.runtime.volumes import VolumeEntry, VolumeNotFound

MAX_DEPTH = 10  # the deepest list_dir (E2B's bound)
MAX_ENTRIES = 100_000  # a listing holds at most this many entries (the answer is held whole)
MAX_ID = 65535  # guest ids: the sandboxes' id maps cover 0..65535
# Without uid/gid: the guest's ``user``, who owns the volume's root, so that what the content
# API makes a sandbox's ``user`` may change too (E2B makes it writable to every user: id
# 9090, modes 0666/0777).
DEFAULT_ID = 1000
DEFAULT_FILE_MODE = 0o644
DEFAULT_DIR_MODE = 0o755


def _norm(path: str) -> str:
    """An absolute, normalised path in the volume (a relative one is under its root, as
    E2B's: ``~`` is a name like any other; ``..`` stops at the root)."""
    return guest_path(path if path.startswith("/") else f"/{path}", "/")


def _error(exc: OSError, path: str) -> GuestFileError:
    return GuestFileError(exc.errno or errno.EIO, f"{path}: {exc.strerror or exc}")


def _check_id(value: int | None, what: str) -> int:
    if value is None:
        return DEFAULT_ID
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise GuestFileError(errno.EINVAL, f"{what} must be between 0 and {MAX_ID}")
    return value


def _check_mode(value: int | None, default: int) -> int:
    """The permission bits of ``value`` (E2B applies only those: ``os.ModePerm``)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
        raise GuestFileError(errno.EINVAL, "mode must be an unsigned 32-bit integer")
    return value & 0o777


def _kind(mode: int) -> FileType:
    if stat.S_ISLNK(mode):
        return FileType.SYMLINK
    if stat.S_ISDIR(mode):
        return FileType.DIRECTORY
    if stat.S_ISREG(mode):
        return FileType.FILE
    return FileType.OTHER


def _entry(path: str, st: os.stat_result, target: str | None) -> VolumeEntry:
    return VolumeEntry(
        name=path.rsplit("/", 1)[1] or "/",
        type=_kind(st.st_mode),
        path=path,
        size=st.st_size,
        mode=st.st_mode & 0o777,
        uid=st.st_uid,
        gid=st.st_gid,
        atime=st.st_atime,
        mtime=st.st_mtime,
        ctime=st.st_ctime,
        target=target,
    )


def _open_child(dir_fd: int, name: str, flags: int) -> int:
    """The entry ``name`` of ``dir_fd`` itself: a symlink is not followed (ELOOP) and a
    mount point is not crossed (EXDEV)."""
    return openat2(dir_fd, name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, resolve=RESOLVE_NO_XDEV)


def _remove_tree(dir_fd: int, name: str, path: str) -> None:
    """Remove ``name`` in ``dir_fd`` with all it holds, without following a symlink,
    crossing a mount point (EBUSY) or recursing on the host's stack."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return
    except IsADirectoryError:
        pass
    except OSError as exc:
        if exc.errno != errno.EPERM:  # EPERM: unlink of a directory on some file systems
            raise _error(exc, path) from None
    stack: list[tuple[int, str, int]] = []  # (directory fd, its name, its parent's fd)
    try:
        try:
            stack.append((_open_child(dir_fd, name, os.O_RDONLY | os.O_DIRECTORY), name, dir_fd))
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
                    stack.append((_open_child(fd, sub, os.O_RDONLY | os.O_DIRECTORY), sub, fd))
                    continue
                stack.pop()
                os.close(fd)
                os.rmdir(dname, dir_fd=pfd)
        except GuestFileError as exc:
            if exc.errno == errno.EXDEV:
                raise GuestFileError(errno.EBUSY, f"{path}: holds a mount point") from None
            raise
    except OSError as exc:
        raise _error(exc, path) from None
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _chmod_name(dir_fd: int, name: str, path: str, mode: int) -> None:
    """chmod of ``name`` itself: through an ``O_PATH | O_NOFOLLOW`` descriptor of it (the
    inode found, whatever the name becomes meanwhile); a symlink's mode cannot be set."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise GuestFileError(errno.EOPNOTSUPP, f"{path}: a symlink's mode cannot be changed")
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


class _Reader:
    """The chunks of an opened regular file; closes it at the end (or on :meth:`close`)."""

    def __init__(self, fd: int, chunk_size: int, path: str) -> None:
        self._fd: int | None = fd
        self._chunk = chunk_size
        self._path = path

    def __iter__(self) -> _Reader:
        return self

    def __next__(self) -> bytes:
        if self._fd is None:
            raise StopIteration
        try:
            data = os.read(self._fd, self._chunk)
        except OSError as exc:
            self.close()
            raise _error(exc, self._path) from None
        if not data:
            self.close()
            raise StopIteration
        return data

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class LocalVolumeFiles:
    """:class:`~e2bfacade.runtime.volumes.VolumeFiles` on the volume mounted at ``root``.
    Holds no descriptor between calls; any thread may call any method."""

    def __init__(self, root: Path) -> None:
        self.root = root

    # ------------------------------------------------------------------ resolution
    @contextlib.contextmanager
    def _root(self) -> Iterator[int]:
        try:
            fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise VolumeNotFound(f"the volume's storage is not there: {exc.strerror}") from None
        try:
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _open(root: int, path: str, flags: int) -> int:
        """``path`` resolved inside the volume (symlinks followed there, never out of it, no
        mount point crossed)."""
        return openat2(root, path, flags | os.O_CLOEXEC, resolve=RESOLVE_NO_XDEV)

    @contextlib.contextmanager
    def _parent(self, root: int, path: str) -> Iterator[tuple[int, str]]:
        """The resolved directory holding ``path`` and its last component (never followed)."""
        if path == "/":
            raise GuestFileError(errno.EBUSY, "/: the volume's root cannot be changed")
        parent, name = path.rsplit("/", 1)
        fd = self._open(root, parent or "/", os.O_PATH | os.O_DIRECTORY)
        try:
            yield fd, name
        finally:
            os.close(fd)

    def _exists(self, root: int, path: str) -> bool:
        """Whether ``path`` names anything (its last component not followed)."""
        try:
            with self._parent(root, path) as (dir_fd, name):
                os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                return True
        except (GuestFileError, OSError):
            return False

    @staticmethod
    def _lstat(dir_fd: int, name: str, path: str) -> VolumeEntry:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            target = os.readlink(name, dir_fd=dir_fd) if stat.S_ISLNK(st.st_mode) else None
        except OSError as exc:
            raise _error(exc, path) from None
        return _entry(path, st, target)

    def _make_parents(self, root: int, path: str, uid: int, gid: int) -> None:
        """Every missing directory above ``path`` (mode 0755, owned by ``uid``/``gid``)."""
        parts = [p for p in path.split("/") if p][:-1]
        current = ""
        for part in parts:
            current = f"{current}/{part}"
            try:
                os.close(self._open(root, current, os.O_PATH | os.O_DIRECTORY))
                continue
            except GuestFileError as exc:
                if exc.errno != errno.ENOENT:
                    raise
            self._mkdir(root, current, uid, gid, DEFAULT_DIR_MODE, exist_ok=True)

    def _mkdir(self, root: int, path: str, uid: int, gid: int, mode: int, exist_ok: bool) -> bool:
        """Make the directory ``path``, owned and moded as asked; False when one was there
        (``exist_ok``: a directory, or a symlink to one, inside the volume)."""
        with self._parent(root, path) as (dir_fd, name):
            try:
                os.mkdir(name, 0o700, dir_fd=dir_fd)
            except FileExistsError:
                if not exist_ok:
                    raise GuestFileError(errno.EEXIST, f"{path}: already exists") from None
                os.close(self._open(root, path, os.O_PATH | os.O_DIRECTORY))
                return False
            except OSError as exc:
                raise _error(exc, path) from None
            try:
                # Set through a descriptor of the new directory itself: a guest that swaps
                # it for a symlink meanwhile makes this fail (O_NOFOLLOW), never redirects it.
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                try:
                    os.fchown(fd, uid, gid)
                    os.fchmod(fd, mode)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise _error(exc, path) from None
            return True

    # ------------------------------------------------------------------ operations
    def stat(self, path: str) -> VolumeEntry:
        path = _norm(path)
        with self._root() as root:
            if path == "/":
                return _entry("/", os.fstat(root), None)
            with self._parent(root, path) as (dir_fd, name):
                return self._lstat(dir_fd, name, path)

    def list_dir(self, path: str, depth: int = 1) -> list[VolumeEntry]:
        path = _norm(path)
        if not 1 <= depth <= MAX_DEPTH:
            raise GuestFileError(errno.EINVAL, f"depth must be between 1 and {MAX_DEPTH}")
        out: list[VolumeEntry] = []
        with self._root() as root:
            top = self._open(root, path, os.O_RDONLY | os.O_DIRECTORY)
            # Depth first, names in order (as E2B lists), with an explicit stack of
            # (directory fd, its path, its level, the names left): a deep tree cannot
            # exhaust ours. A symlink is listed, never walked; a mount point is not crossed.
            stack: list[tuple[int, str, int, list[str]]] = []
            try:
                stack.append((top, path, 1, sorted(os.listdir(top), reverse=True)))
                while stack:
                    dir_fd, dir_path, level, names = stack[-1]
                    if not names:
                        os.close(dir_fd)
                        stack.pop()
                        continue
                    name = names.pop()
                    child = f"{dir_path.rstrip('/')}/{name}"
                    try:
                        entry = self._lstat(dir_fd, name, child)
                    except GuestFileError as exc:
                        if exc.errno == errno.ENOENT:
                            continue  # gone meanwhile
                        raise
                    out.append(entry)
                    if len(out) > MAX_ENTRIES:
                        raise GuestFileError(
                            errno.E2BIG,
                            f"{path}: more than {MAX_ENTRIES} entries: list a smaller depth",
                        )
                    if entry.type is not FileType.DIRECTORY or level >= depth:
                        continue
                    try:
                        sub = _open_child(dir_fd, name, os.O_RDONLY | os.O_DIRECTORY)
                    except GuestFileError:
                        continue  # replaced meanwhile, or a mount point: listed, not walked
                    try:
                        below = sorted(os.listdir(sub), reverse=True)
                    except OSError:
                        os.close(sub)
                        continue
                    stack.append((sub, child, level + 1, below))
            except OSError as exc:
                raise _error(exc, path) from None
            finally:
                for dir_fd, _, _, _ in stack:
                    os.close(dir_fd)
        return out

    def make_dir(
        self,
        path: str,
        *,
        uid: int | None = None,
        gid: int | None = None,
        mode: int | None = None,
        force: bool = False,
    ) -> VolumeEntry:
        """As E2B: ``force`` makes the missing parents and accepts a directory already
        there (left as it is); without it, anything there is EEXIST."""
        path = _norm(path)
        uid_, gid_ = _check_id(uid, "uid"), _check_id(gid, "gid")
        mode_ = _check_mode(mode, DEFAULT_DIR_MODE)
        with self._root() as root:
            if path == "/":
                if not force:
                    raise GuestFileError(errno.EEXIST, "/: already exists")
                return _entry("/", os.fstat(root), None)
            if force:
                self._make_parents(root, path, uid_, gid_)
            try:
                self._mkdir(root, path, uid_, gid_, mode_, exist_ok=force)
            except GuestFileError as exc:
                if exc.errno == errno.ENOTDIR and self._exists(root, path):
                    raise GuestFileError(errno.EEXIST, f"{path}: exists, not a directory") from None
                raise
            fd = self._open(root, path, os.O_PATH | os.O_DIRECTORY)
            try:
                return _entry(path, os.fstat(fd), None)
            finally:
                os.close(fd)

    def read_file(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        path = _norm(path)
        with self._root() as root:
            # O_PATH: nothing of the file is opened (a FIFO cannot block, a device node is
            # never touched) until fstat says it is a regular file.
            where = self._open(root, path, os.O_PATH)
            try:
                st = os.fstat(where)
                if stat.S_ISDIR(st.st_mode):
                    raise GuestFileError(errno.EISDIR, f"{path}: is a directory")
                if not stat.S_ISREG(st.st_mode):
                    raise GuestFileError(errno.EINVAL, f"{path}: not a regular file")
                try:
                    # The same inode, reopened for reading through its descriptor.
                    fd = os.open(
                        f"/proc/self/fd/{where}",
                        os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC,
                    )
                except OSError as exc:
                    raise _error(exc, path) from None
            finally:
                os.close(where)
        try:
            again = os.fstat(fd)
            if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(
                again.st_mode
            ):
                raise GuestFileError(errno.EINVAL, f"{path}: not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return _Reader(fd, chunk_size, path)

    def write_file(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        uid: int | None = None,
        gid: int | None = None,
        mode: int | None = None,
        force: bool = False,
    ) -> VolumeEntry:
        """As E2B: without ``force`` the file must not exist yet (EEXIST); ``force`` makes
        the missing parents and replaces what is there (a file, a symlink — never its
        target —, not a directory: EISDIR). The new content is written to an unnamed file
        in the same directory and put in place at once when complete: a cut body, an error
        or a full volume leave the old file as it was and nothing else behind."""
        path = _norm(path)
        uid_, gid_ = _check_id(uid, "uid"), _check_id(gid, "gid")
        mode_ = _check_mode(mode, DEFAULT_FILE_MODE)
        with self._root() as root:
            if path == "/":
                raise GuestFileError(errno.EISDIR, "/: is a directory")
            if force:
                self._make_parents(root, path, uid_, gid_)
            with self._parent(root, path) as (dir_fd, name):
                try:
                    there = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    there = None
                except OSError as exc:
                    raise _error(exc, path) from None
                if there is not None:
                    if not force:
                        raise GuestFileError(errno.EEXIST, f"{path}: already exists")
                    if stat.S_ISDIR(there.st_mode):
                        raise GuestFileError(errno.EISDIR, f"{path}: is a directory")
                self._write_new(dir_fd, name, path, chunks, uid_, gid_, mode_, force)
                return self._lstat(dir_fd, name, path)

    @staticmethod
    def _write_new(
        dir_fd: int,
        name: str,
        path: str,
        chunks: Iterable[bytes],
        uid: int,
        gid: int,
        mode: int,
        replace: bool,
    ) -> None:
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise _error(exc, path) from None
        temp: str | None = None
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
            os.fsync(fd)
            source = f"/proc/self/fd/{fd}"
            if not replace:
                # linkat fails with EEXIST when the name appeared meanwhile: never replaced.
                os.link(source, name, dst_dir_fd=dir_fd, follow_symlinks=True)
                return
            temp = f".e2b-volume-{secrets.token_hex(8)}.tmp"
            os.link(source, temp, dst_dir_fd=dir_fd, follow_symlinks=True)
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            temp = None
        except OSError as exc:
            raise _error(exc, path) from None
        finally:
            os.close(fd)
            if temp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)

    def update(
        self, path: str, *, uid: int | None = None, gid: int | None = None, mode: int | None = None
    ) -> VolumeEntry:
        """chmod and chown of the name itself, never of a symlink's target (a symlink's
        mode cannot be changed: EOPNOTSUPP; its owner can)."""
        path = _norm(path)
        uid_ = None if uid is None else _check_id(uid, "uid")
        gid_ = None if gid is None else _check_id(gid, "gid")
        mode_ = None if mode is None else _check_mode(mode, 0)
        with self._root() as root:
            if path == "/":
                try:
                    fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                except OSError as exc:
                    raise _error(exc, path) from None
                try:
                    if mode_ is not None:
                        os.fchmod(fd, mode_)
                    if uid_ is not None or gid_ is not None:
                        os.fchown(fd, -1 if uid_ is None else uid_, -1 if gid_ is None else gid_)
                    return _entry("/", os.fstat(fd), None)
                finally:
                    os.close(fd)
            with self._parent(root, path) as (dir_fd, name):
                try:
                    if mode_ is not None:
                        _chmod_name(dir_fd, name, path, mode_)
                    if uid_ is not None or gid_ is not None:
                        os.chown(
                            name,
                            -1 if uid_ is None else uid_,
                            -1 if gid_ is None else gid_,
                            dir_fd=dir_fd,
                            follow_symlinks=False,
                        )
                except OSError as exc:
                    raise _error(exc, path) from None
                return self._lstat(dir_fd, name, path)

    def remove(self, path: str) -> None:
        path = _norm(path)
        with self._root() as root:
            if path == "/":
                raise GuestFileError(errno.EBUSY, "/: the volume's root cannot be removed")
            with self._parent(root, path) as (dir_fd, name):
                try:
                    os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError as exc:
                    raise _error(exc, path) from None
                _remove_tree(dir_fd, name, path)
