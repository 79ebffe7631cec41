"""One running local sandbox's guest side (:class:`e2bfacade.runtime.guest.Guest`),
resolved once: its record read, its init checked alive and not frozen, then every call
goes straight to its agent (processes, watchers), its root (files) or its network
namespace (ports)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from e2bfacade.runtime.base import (
    CreateRefused,
    EntryInfo,
    FileType,
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
from e2bfacade.runtime.local.guest.syscalls import open_guest_root
from e2bfacade.runtime.local.net import netns
from e2bfacade.runtime.local.processes import (
    Agent,
    AgentProcess,
    AgentWatch,
    process_env,
    read_in_guest,
    start_items,
)
from e2bfacade.runtime.local.record import SandboxRecord
from e2bfacade.runtime.local.state import proc_starttime


class LocalGuest:
    def __init__(
        self,
        record: SandboxRecord,
        info: SandboxInfo,
        agent: Path | tuple[str, int],
        frozen: Callable[[], bool],
        *,
        id_base: int | None = None,
    ) -> None:
        """``agent``: where its agent listens (a unix socket on the host, or an address on
        the sandbox's link); ``id_base``: the host id its files store for guest id 0 (None:
        its id range's, as its user namespace maps them)."""
        self.record = record
        self.info = info  # as the data plane checks a caller against it (tokens, user)
        self.sandbox_id = record.sandbox_id
        self._agent = Agent(agent)
        self._frozen = frozen
        self.id_base = record.id_base if id_base is None else id_base

    def running(self) -> bool:
        # As census.status_of decides it, for this init only: its pid still names it (a
        # read of /proc/<pid>/stat), and its cgroup is not frozen (a read of the freezer's
        # file). A filesystem pause or a kill ends the init; a memory pause freezes it.
        r = self.record
        return proc_starttime(r.init_pid) == r.init_start and not self._frozen()

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
        if not 0 < port < 65536:
            raise GuestFileError(errno.EINVAL, f"port {port} is not a TCP port")
        return netns.connect(self.record.init_pid, self.record.init_start, port, timeout)

    # -------------------------------------------------------------------------- files
    def open_root(self) -> int:
        """An O_PATH descriptor of the guest's root, as its init sees it."""
        return open_guest_root(self.record.init_pid, self.record.init_start)

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
        with self._files(user) as files:
            return files.make_dir(path)

    def move(self, source: str, destination: str, *, user: str | None = None) -> EntryInfo:
        with self._files(user) as files:
            return files.move(source, destination)

    def remove(self, path: str, *, user: str | None = None) -> None:
        with self._files(user) as files:
            files.remove(path)

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
        with self._files(user) as files:
            return files.write(path, chunks, metadata)


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
