"""The guest half of the runtime interface: envd's part of a sandbox (processes, files,
watchers, ports), reached through one :class:`Guest` per sandbox.

``Runtime.guest(sandbox_id)`` resolves the sandbox once — its record, its init's identity,
its id range, its default user, its env vars, its agent — and raises ``SandboxNotFound``
(no such sandbox) or ``RuntimeConflict`` (not running: a paused guest runs nothing and its
files are not to change) once; the data plane resolves one per request. Paths are guest
paths: absolute, or relative to the user's home; they are resolved inside the guest's own
root (its symlinks cannot lead out of it) and used with the user's permissions; what is
created is owned by the user.
"""

from __future__ import annotations

import dataclasses
import enum
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

# The errors a guest raises are the interface's (errors.py); re-exported here with its types.
from e2bfacade.runtime.errors import GuestFileError as GuestFileError
from e2bfacade.runtime.errors import ProcessNotFound as ProcessNotFound
from e2bfacade.runtime.errors import SandboxRuntimeError
from e2bfacade.runtime.errors import UnknownUser as UnknownUser
from e2bfacade.runtime.specs import SandboxInfo, Stream


# --------------------------------------------------------------------------- processes
@dataclass(frozen=True)
class PtySize:
    cols: int
    rows: int


@dataclass(frozen=True)
class ProcessSpec:
    """A process to start inside a sandbox.

    ``user`` is a guest account name (None: the sandbox's default user), resolved in the
    guest's own ``/etc/passwd``; ``cwd`` None is that user's home. ``env`` goes on top of
    the sandbox's env vars. With ``stdin`` False the process reads /dev/null. With ``pty``
    the process gets a terminal of that size as its controlling terminal, and its output
    arrives as one ``pty`` stream. ``timeout`` is the process's lifetime in seconds: when
    it elapses the process and everything in its process group are killed (None:
    unlimited). The lifetime is the driver's to enforce, not the caller's, so it holds
    even if the caller goes away.
    """

    argv: tuple[str, ...]
    user: str | None = None
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: bool = False
    pty: PtySize | None = None
    timeout: float | None = None
    tag: str | None = None  # shown by list_processes; E2B's ProcessInfo.tag


@dataclass(frozen=True)
class ProcessInfo:
    """A running process as :meth:`.guest.Guest.list_processes` shows it: what it was started
    with (``env`` is what the caller asked for on top of the sandbox's env vars)."""

    pid: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    tag: str | None = None
    pty: bool = False


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: ``exit_code`` shell-style (128 + the signal when killed by one)
    and ``signal`` the signal number, or None when it exited by itself."""

    exit_code: int
    signal: int | None = None


class GuestProcess(Protocol):
    """A running process. Reading its output never buffers more than one chunk on the
    host: a caller that stops reading stops the guest writing (the pipe fills)."""

    @property
    def pid(self) -> int:
        """The process's pid as the guest sees it."""
        ...

    def output(self, chunk_size: int = 65536) -> Iterator[tuple[Stream, bytes]]:
        """Chunks of at most ``chunk_size`` bytes as they come, until the process has ended
        and what it wrote is read. A background child that keeps the output open after the
        process ended does not keep the stream open: the host never waits on a guest's
        grandchildren."""
        ...

    def write_stdin(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def send_signal(self, signum: int) -> None:
        """Signal the process's whole process group (what it started too)."""
        ...

    def resize(self, size: PtySize) -> None: ...
    def wait(self, timeout: float | None = None) -> ExitStatus:
        """Wait for the process itself to end (not for its output to close); raises
        TimeoutError when ``timeout`` elapses first."""
        ...

    def close(self) -> None:
        """Release the host's side (pipes, descriptors). A running process keeps running
        until its lifetime ends; kill it first with :meth:`send_signal` if it should not."""
        ...


@dataclass(frozen=True)
class ProcessResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: int | None = None
    truncated: bool = False  # output beyond max_output was read and dropped


# ------------------------------------------------------------------------------- files
class FileType(enum.StrEnum):
    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    OTHER = "other"


@dataclass(frozen=True)
class EntryInfo:
    """A guest file as ``lstat`` sees it (a symlink is reported as itself, with its
    target). ``path`` is absolute in the guest; ``owner``/``group`` are guest names where
    the guest's passwd/group name them, else the numeric id."""

    name: str
    path: str
    type: FileType
    size: int
    mode: int  # permission bits and file type, as st_mode
    owner: str
    group: str
    modified_time: float
    symlink_target: str | None = None
    # User metadata kept with a regular file (the ``user.e2b.*`` extended attributes).
    metadata: Mapping[str, str] = field(default_factory=dict)


class FsChange(enum.IntEnum):
    """What happened to a watched directory's entry (inotify's kinds, as fsnotify names them)."""

    CREATE = 1
    WRITE = 2
    REMOVE = 3
    RENAME = 4
    CHMOD = 5


@dataclass(frozen=True)
class FsEvent:
    change: FsChange
    name: str  # relative to the watched directory


@dataclass(frozen=True)
class WatcherChanges:
    """What a kept watcher saw since the last call, with what it was created for."""

    path: str  # the watched directory, as a guest path
    include_entry: bool
    events: tuple[FsEvent, ...]


class DirWatch(Protocol):
    """A directory followed for changes until closed (iterating blocks until the next)."""

    def __iter__(self) -> Iterator[FsEvent]: ...
    def close(self) -> None: ...


class Guest(Protocol):
    sandbox_id: str
    # The sandbox as it was resolved (its tokens and default user, for the data plane).
    info: SandboxInfo

    def running(self) -> bool:
        """Whether the sandbox as it was resolved still runs: not ended, not paused (frozen
        or not). Cheap and non-blocking (a few reads of the kernel's state, no lookup and no
        call to the guest), so an event loop may ask it every second; the data plane cuts
        the open streams of a guest that no longer runs (its ``liveness``)."""
        ...

    def start_process(self, spec: ProcessSpec) -> GuestProcess:
        """Start ``spec``. The process belongs to the sandbox, not to the caller: it runs on
        when the returned handle is closed or the calling process exits, until it ends or
        its lifetime does, and the by-pid calls below reach it from any process."""
        ...

    def list_processes(self) -> list[ProcessInfo]: ...
    def connect_process(self, pid: int) -> GuestProcess:
        """Follow a running process's output from now on (every follower gets all of it);
        for one that ended moments ago, a handle whose output is empty and whose wait()
        answers at once. Raises ProcessNotFound."""
        ...

    def process_stdin(self, pid: int, data: bytes) -> None: ...
    def process_close_stdin(self, pid: int) -> None: ...
    def process_signal(self, pid: int, signum: int) -> None:
        """Signal the process's group. Raises ProcessNotFound."""
        ...

    def process_resize(self, pid: int, size: PtySize) -> None: ...
    def watch_dir(self, path: str, *, recursive: bool = False, user: str | None = None) -> DirWatch:
        """Follow the changes of a directory (and, ``recursive``, of every one under it)."""
        ...

    def create_watcher(
        self,
        path: str,
        *,
        recursive: bool = False,
        user: str | None = None,
        include_entry: bool = False,
    ) -> str:
        """A watcher kept by the sandbox, whose changes :meth:`watcher_events` drains: it
        outlives the caller, as a process does. Its id is returned. ``include_entry`` is
        kept with it for the caller (who looks the entries up)."""
        ...

    def watcher_events(self, watcher_id: str) -> WatcherChanges:
        """Raises GuestFileError(ENOENT) for an unknown watcher, EOVERFLOW when changes
        were lost since the last call."""
        ...

    def remove_watcher(self, watcher_id: str) -> None: ...
    def connect_port(self, port: int, *, timeout: float = 5.0) -> socket.socket:
        """A TCP connection to ``port`` on the sandbox's own loopback (what listens inside
        it, reached from the host without any network between them). Raises
        GuestFileError(ECONNREFUSED) when nothing listens there."""
        ...

    def stat(self, path: str, *, user: str | None = None) -> EntryInfo: ...
    def list_dir(
        self, path: str, *, user: str | None = None, depth: int = 1
    ) -> list[EntryInfo]: ...
    def make_dir(self, path: str, *, user: str | None = None) -> bool:
        """Create the directory and its missing parents; False when it already existed."""
        ...

    def move(self, source: str, destination: str, *, user: str | None = None) -> EntryInfo: ...
    def remove(self, path: str, *, user: str | None = None) -> None:
        """Remove a file or a directory tree; a missing path is not an error."""
        ...

    def read_file(
        self, path: str, *, user: str | None = None, chunk_size: int = 65536
    ) -> Iterator[bytes]: ...
    def write_file(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        user: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> EntryInfo:
        """Replace the file's content with ``chunks``, creating missing parents. With
        ``metadata`` (None: leave it), the file's metadata becomes exactly that map."""
        ...


def run_process(
    guest: Guest, spec: ProcessSpec, *, stdin: bytes = b"", max_output: int = 16 << 20
) -> ProcessResult:
    """Start ``spec``, feed it ``stdin``, collect its output and wait for it — the buffered
    convenience over :meth:`Guest.start_process` (tests, benches, operator commands). At
    most ``max_output`` bytes of each stream are kept; the rest is read and dropped, so a
    guest that writes without end cannot grow the host. Returns when the process has ended
    (its lifetime, ``spec.timeout``, bounds that) and its written output is read."""
    if stdin and not spec.stdin:
        spec = dataclasses.replace(spec, stdin=True)
    proc = guest.start_process(spec)
    feeder = None
    try:
        if spec.stdin:
            # On a thread: a process that writes before it reads must not deadlock us.
            def feed() -> None:
                try:
                    if stdin:
                        proc.write_stdin(stdin)
                    proc.close_stdin()
                except (OSError, SandboxRuntimeError):
                    pass  # it closed its stdin or ended: what it read is what it gets

            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
        kept: dict[Stream, bytearray] = {s: bytearray() for s in Stream}
        truncated = False
        for stream, data in proc.output():
            room = max_output - len(kept[stream])
            if len(data) > room:
                truncated = True
            kept[stream] += data[: max(room, 0)]
        status = proc.wait()
        if feeder is not None:
            feeder.join(timeout=5)
    finally:
        proc.close()
    stdout = bytes(kept[Stream.PTY] if spec.pty else kept[Stream.STDOUT])
    return ProcessResult(
        status.exit_code, stdout, bytes(kept[Stream.STDERR]), status.signal, truncated
    )
