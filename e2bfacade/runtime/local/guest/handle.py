"""One running sandbox's guest side (:class:`e2bfacade.runtime.guest.Guest`) on the host
runtime, resolved once: its record read, its init checked alive and not frozen, then every
call goes straight to its agent (processes, watchers), its root (files) or its ports, as
its sandboxer's reach (reach.py) says they are reached."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import PurePosixPath

from e2bfacade.runtime.base import (
    CreateRefused,
    EntryInfo,
    FileType,
    FsChange,
    GuestFileError,
    ProcessInfo,
    ProcessNotFound,
    ProcessSpec,
    PtySize,
    SandboxInfo,
    WatcherChanges,
)
from e2bfacade.runtime.local.guest.accounts import lookup_user
from e2bfacade.runtime.local.guest.files import GuestFiles, KernelFile
from e2bfacade.runtime.local.guest.reach import GuestReach, runs
from e2bfacade.runtime.local.processes import (
    Agent,
    AgentProcess,
    AgentWatch,
    process_env,
    read_in_guest,
    start_items,
)
from e2bfacade.runtime.local.record import SandboxRecord


class LocalGuest:
    def __init__(
        self,
        record: SandboxRecord,
        info: SandboxInfo,
        reach: GuestReach,
        frozen: Callable[[], bool],
    ) -> None:
        self.record = record
        self.info = info  # as the data plane checks a caller against it (tokens, user)
        self.sandbox_id = record.sandbox_id
        self._reach = reach
        self._agent = Agent(reach.agent)
        self._frozen = frozen
        self.id_base = reach.id_base  # the host id of guest id 0 in its files

    def running(self) -> bool:
        # As census.status_of decides it, for this init only (a filesystem pause or a kill
        # ends the init; a memory pause freezes or checkpoints it).
        return runs(self.record, self._frozen)

    # ---------------------------------------------------------------------- processes
    def start_process(self, spec: ProcessSpec) -> AgentProcess:
        if not spec.argv or any("\0" in a for a in (*spec.argv, spec.tag or "")):
            raise CreateRefused("a process needs a command, without NUL bytes")
        r = self.record
        root_fd = self.open_root()
        try:
            account = lookup_user(root_fd, spec.user or r.default_user)
        finally:
            os.close(root_fd)
        env = process_env(account, {**r.image_env, **r.env_vars}, spec)
        if any("\0" in k or "\0" in v or "=" in k for k, v in env.items()):
            raise CreateRefused("an environment variable contains a NUL byte or '=' in its name")
        # envd's order: the request's cwd, else the template's final WORKDIR, else home.
        cwd = spec.cwd or r.image_workdir or account.home
        if "\0" in cwd:
            raise CreateRefused("the working directory contains a NUL byte")
        return self._agent.start(start_items(account, spec, env, cwd), pty=spec.pty is not None)

    def list_processes(self) -> list[ProcessInfo]:
        return [
            ProcessInfo(e.pid, e.args, e.user_env, e.cwd, e.tag, e.pty) for e in self._agent.list()
        ]

    def connect_process(self, pid: int) -> AgentProcess:
        with _by_pid(pid):
            return self._agent.connect(pid)

    def process_stdin(self, pid: int, data: bytes) -> None:
        with _by_pid(pid):
            self._agent.write_stdin(pid, data)

    def process_close_stdin(self, pid: int) -> None:
        with _by_pid(pid):
            self._agent.close_stdin(pid)

    def process_signal(self, pid: int, signum: int) -> None:
        with _by_pid(pid):
            self._agent.signal(pid, signum)

    def process_resize(self, pid: int, size: PtySize) -> None:
        with _by_pid(pid):
            self._agent.resize(pid, size)

    # ----------------------------------------------------------------------- watchers
    def _watched(self, path: str, user: str | None) -> str:
        """The guest path of a directory the user may watch (it must exist)."""
        with self._files(user) as files:
            entry = files.stat(path)
            if entry.type is not FileType.DIRECTORY:
                raise GuestFileError(errno.ENOTDIR, f"path '{path}' is not a directory")
            return files.path(path)

    def watch_dir(
        self, path: str, *, recursive: bool = False, user: str | None = None
    ) -> AgentWatch:
        return self._agent.watch(self._watched(path, user), recursive=recursive)

    def create_watcher(
        self,
        path: str,
        *,
        recursive: bool = False,
        user: str | None = None,
        include_entry: bool = False,
    ) -> str:
        guest = self._watched(path, user)
        number = self._agent.new_watcher(guest, recursive=recursive, include_entry=include_entry)
        return f"w{number}"

    def watcher_events(self, watcher_id: str) -> WatcherChanges:
        return self._agent.watcher_changes(_watcher_number(watcher_id))

    def remove_watcher(self, watcher_id: str) -> None:
        self._agent.remove_watcher(_watcher_number(watcher_id))

    # -------------------------------------------------------------------------- ports
    def connect_port(self, port: int, *, timeout: float = 5.0) -> socket.socket:
        return self._reach.connect_port(port, timeout)

    # -------------------------------------------------------------------------- files
    def open_root(self) -> int:
        """An O_PATH descriptor of the guest's root (its reach's)."""
        return self._reach.open_root()

    def _files(self, user: str | None) -> GuestFiles:
        r = self.record
        return GuestFiles(self.open_root(), user or r.default_user, self.id_base)

    def stat(self, path: str, *, user: str | None = None) -> EntryInfo:
        with self._files(user) as files:
            return files.stat(path)

    def list_dir(self, path: str, *, user: str | None = None, depth: int = 1) -> list[EntryInfo]:
        with self._files(user) as files:
            return files.list_dir(path, depth)

    def make_dir(self, path: str, *, user: str | None = None) -> bool:
        if not self._reach.tells_watchers:
            with self._files(user) as files:
                return files.make_dir(path)
        where, _ = self._where(path, user)
        missing: list[str] = []  # the directories this makes, outermost first
        parent = PurePosixPath(where)
        while str(parent) != "/" and not self._where(str(parent), user)[1]:
            missing.insert(0, str(parent))
            parent = parent.parent
        with self._files(user) as files:
            made = files.make_dir(path)
        self._tell(*((FsChange.CREATE, d, True) for d in missing))
        return made

    def move(self, source: str, destination: str, *, user: str | None = None) -> EntryInfo:
        src = self._where(source, user)[0] if self._reach.tells_watchers else ""
        with self._files(user) as files:
            entry = files.move(source, destination)
        if self._reach.tells_watchers:
            is_dir = entry.type is FileType.DIRECTORY
            self._tell((FsChange.RENAME, src, is_dir), (FsChange.CREATE, entry.path, is_dir))
        return entry

    def remove(self, path: str, *, user: str | None = None) -> None:
        where, existed = self._where(path, user) if self._reach.tells_watchers else ("", False)
        with self._files(user) as files:
            files.remove(path)
        if existed:
            self._tell((FsChange.REMOVE, where, False))

    def read_file(
        self, path: str, *, user: str | None = None, chunk_size: int = 65536
    ) -> Iterator[bytes]:
        with self._files(user) as files:
            try:
                fd = files.open_read(path)
            except KernelFile as exc:  # the guest's /proc or /sys: the guest reads it
                account, kernel_file = files.account, exc.path
            else:
                return _chunks(fd, chunk_size)
        data = read_in_guest(self._agent, account, kernel_file)
        return iter([data[i : i + chunk_size] for i in range(0, len(data), chunk_size)])

    def write_file(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        user: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> EntryInfo:
        if not self._reach.tells_watchers:
            with self._files(user) as files:
                return files.write(path, chunks, metadata)
        where, existed = self._where(path, user)
        with self._files(user) as files:
            entry = files.write(path, chunks, metadata)
        # What inotify reports for the same write made inside (guest/files.py: the content,
        # then its mode, then the content again over an existing file).
        first = FsChange.WRITE if existed else FsChange.CREATE
        self._tell(*((change, where, False) for change in (first, FsChange.CHMOD, FsChange.WRITE)))
        return entry

    # ------------------------------------------- file operations told to watchers (reach)
    def _tell(self, *changes: tuple[FsChange, str, bool]) -> None:
        """Tell the guest's watchers (best effort: a guest that stopped its agent loses
        only its own events)."""
        for change, path, is_dir in changes:
            try:
                self._agent.notify(change, path, is_dir=is_dir)
            except (GuestFileError, OSError):
                return

    def _where(self, path: str, user: str | None) -> tuple[str, bool]:
        """The guest path of ``path`` for ``user``, and whether something is there."""
        with self._files(user) as files:
            where = files.path(path)
            try:
                files.stat(where)
            except GuestFileError:
                return where, False
            return where, True


def _watcher_number(watcher_id: str) -> int:
    if not (watcher_id.startswith("w") and watcher_id[1:].isdigit()):
        raise GuestFileError(errno.ENOENT, f"watcher '{watcher_id}' does not exist")
    return int(watcher_id[1:]) & 0xFFFFFFFF


@contextlib.contextmanager
def _by_pid(pid: int) -> Iterator[None]:
    """The agent's "no such process" as the interface's ProcessNotFound."""
    if not 0 < pid < 1 << 31:
        raise ProcessNotFound(f"process {pid} does not exist")
    try:
        yield
    except GuestFileError as exc:
        if exc.errno == errno.ESRCH:
            raise ProcessNotFound(f"process {pid} is not running") from None
        raise


def _chunks(fd: int, chunk_size: int) -> Iterator[bytes]:
    with open(fd, "rb", buffering=0, closefd=True) as f:
        while chunk := f.read(chunk_size):
            yield chunk
