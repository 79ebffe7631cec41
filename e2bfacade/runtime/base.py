"""The runtime interface: what the control plane may ask of a sandbox backend — the host's
half (images, sandboxes' lifecycle, capacity, pools, the sweep), and the types both halves
share. The guest's half, envd's (processes, files, watchers, ports), is :mod:`.guest`,
reached through :meth:`Runtime.guest`.

Every operation is keyed by an id the control plane chose, and every mutating operation is
idempotent by that id. That is what lets the idempotency layer re-drive a create after a
crash: creating an id that already exists adopts it instead of allocating a second sandbox.
No method is ever called inside a database transaction.
"""

from __future__ import annotations

import builtins
import enum
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

# Part of the interface, kept in a module of their own (this one is long enough).
from e2bfacade.runtime.measures import LimitEvents as LimitEvents
from e2bfacade.runtime.measures import Metrics as Metrics
from e2bfacade.runtime.policy import NetworkPolicy as NetworkPolicy
from e2bfacade.runtime.policy import UpstreamProxy as UpstreamProxy

if TYPE_CHECKING:
    from e2bfacade.runtime.guest import Guest
    from e2bfacade.runtime.volumes import VolumeMount

# E2B's ids are "i" + 20 of [a-z0-9]; we accept any short URL-safe id and refuse everything
# that could escape a path (/, .., NUL) or a mount option (",", ":", "=").
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


# The image every driver provides out of the box (a usable Linux userland with ``user``
# and ``root``), built on first use. The ``base`` template points at it.
BUILTIN_IMAGE = "base"


class SandboxRuntimeError(Exception):
    """Base of runtime errors; ``message`` is meant for the API caller."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RuntimeUnavailable(SandboxRuntimeError):
    """The host cannot run sandboxes (not root, no namespaces, no cgroups, no compiler)."""


class RuntimeBusy(SandboxRuntimeError):
    """A transient failure (a freeze that did not settle in time): retrying may succeed."""


class InvalidId(SandboxRuntimeError):
    """An id that is not URL-safe."""


class SandboxNotFound(SandboxRuntimeError):
    pass


class ImageNotFound(SandboxRuntimeError):
    pass


class RuntimeConflict(SandboxRuntimeError):
    """The id exists with a different spec, or the sandbox is in the wrong state."""


class ImageInUse(SandboxRuntimeError):
    pass


class LimitExceeded(SandboxRuntimeError):
    """The request is over a configured limit (a snapshot larger than allowed); nothing was
    made. Deterministic: the same request fails the same way."""


class CreateRefused(SandboxRuntimeError):
    """Creation failed and everything it made was rolled back: provably nothing allocated."""


class ProcessNotFound(SandboxRuntimeError):
    """No running process has that pid in the sandbox (it ended, or never was)."""


def check_id(value: str, what: str = "id") -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise InvalidId(
            f"{what} {value!r} is not URL-safe: use 1-63 characters of letters, digits, "
            "'-' and '_', starting with a letter or digit"
        )
    return value


class SandboxState(enum.StrEnum):
    RUNNING = "running"
    # Paused: its processes frozen with their memory (PauseMode.FULL), or ended with its
    # files kept (PauseMode.FILESYSTEM: a pause that dropped memory, or a sandbox whose
    # processes died under it — a crash, a host reboot — which a resume cold-boots).
    PAUSED = "paused"
    # Nothing of it is left to resume: a pool sandbox or a half-made one whose processes
    # are gone, or one whose disk is gone too. The sweep removes what remains of it.
    DEAD = "dead"


class PauseMode(enum.StrEnum):
    """What a paused sandbox kept (E2B's ``pauseMode``)."""

    FULL = "full"  # its processes and their memory: a resume continues them
    FILESYSTEM = "filesystem"  # its files only: a resume cold-boots it from its disk


# The pause reason of a sandbox whose processes ended without being paused (the runtime or
# the host went down under it, or it was killed as a whole): its files are kept.
CRASH_REASON = (
    "its processes ended unexpectedly (the host or the runtime restarted, or it was killed "
    "as a whole): its files were kept, and a resume cold-boots it from them"
)


class Capability(enum.StrEnum):
    """What a driver can do beyond the core (create, pause by freezing, resume, snapshot
    files, kill, status, list, metrics, which every driver must). The API refuses a request
    that needs a capability its driver lacks, naming the field (see ``sandboxes.features``),
    so no driver is ever asked for what it cannot honour."""

    INTERNET_ACCESS = "internet_access"  # egress beyond the sandbox's own loopback
    NETWORK_RULES = "network_rules"  # allowOut / denyOut / dnsServers / rules
    FILESYSTEM_PAUSE = "filesystem_pause"  # pause(memory=False): drops memory, keeps files
    REBOOT_ON_RESUME = "reboot_on_resume"  # resume(memory=False): fresh processes, kept files
    MEMORY_SNAPSHOTS = "memory_snapshots"  # snapshots that capture process memory
    VOLUME_MOUNTS = "volume_mounts"  # persistent volumes mounted into the guest
    DISK_QUOTA = "disk_quota"  # diskSizeMB enforced
    PROCESSES = "processes"  # Guest.start_process: commands inside the guest
    PTY = "pty"  # Guest.start_process with a terminal
    FILES = "files"  # the Guest's file operations


DEFAULT_USER = "user"
# The smallest disk a sandbox may be given, MiB (a file system needs some for itself).
MIN_DISK_MB = 16


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a sandbox is created with. ``env_vars`` are the environment of every
    process started in it (under a process's own ``env``); ``default_user`` runs processes
    and file operations that name no user; ``envd_access_token`` is what the data plane
    demands of callers (None: no token)."""

    sandbox_id: str
    image_id: str
    cpu_count: int = 2
    memory_mb: int = 512
    pids_max: int = 1024
    disk_mb: int = 1024  # the writable layer's size, bytes and inodes within it
    hostname: str = ""
    env_vars: Mapping[str, str] = field(default_factory=dict)
    default_user: str = DEFAULT_USER
    envd_access_token: str | None = None
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    # Demanded of callers of the sandbox's ports other than envd's (E2B's
    # allowPublicTraffic false; None: its ports are public).
    traffic_access_token: str | None = None
    # E2B's maskRequestHost: the Host header the data plane gives requests it forwards to
    # the sandbox's ports, ``${PORT}`` replaced by the port (None: the caller's own).
    mask_request_host: str | None = None
    # How many started sandboxes of this spec's shape a driver with a warm pool keeps
    # ready for the creates after it (see keep_warm). None: the driver's default (the
    # local runtime's: ``warm`` for an image with a start command, none otherwise).
    warm_pool: int | None = None
    # The volumes mounted into it (e2bfacade.runtime.volumes.VolumeMount), kept across
    # pause, resume and a cold boot; a driver without Capability.VOLUME_MOUNTS gets none.
    volume_mounts: tuple[VolumeMount, ...] = ()


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    image_id: str
    state: SandboxState
    cpu_count: int
    memory_mb: int
    pids_max: int
    created_at: float
    adopted: bool = False  # True when create() found the id already running
    # Set while paused: what it kept, and why it is paused when nobody paused it
    # (CRASH_REASON); None for a pause a caller asked for.
    pause_mode: PauseMode | None = None
    pause_reason: str | None = None
    # What the data plane needs of a sandbox, as it was created (see SandboxSpec).
    envd_access_token: str | None = None
    default_user: str = DEFAULT_USER
    env_vars: Mapping[str, str] = field(default_factory=dict)
    traffic_access_token: str | None = None
    volume_mounts: tuple[VolumeMount, ...] = ()  # as created (SandboxSpec.volume_mounts)
    mask_request_host: str | None = None


@dataclass(frozen=True)
class Capacity:
    """What this runtime's host can give sandboxes in all: admission checks requests
    against it. ``memory_mb`` and ``pids`` are after the host's own reserve (the driver
    enforces them as caps on all sandboxes together); ``disk_mb`` is the size of the
    storage sandboxes' files live on."""

    cpus: int
    memory_mb: int
    pids: int
    disk_mb: int


@dataclass(frozen=True)
class Census:
    """The sandboxes a runtime holds: ``live``, every one that is not dead (running or
    paused), and ``kept``, those of them that have no processes, only their files
    (PauseMode.FILESYSTEM)."""

    live: frozenset[str]
    kept: frozenset[str]


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


class Stream(enum.StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"
    PTY = "pty"


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
class GuestFileError(SandboxRuntimeError):
    """A file operation failed inside the guest; ``errno`` says why (ENOENT, EACCES,
    ENOTDIR, EISDIR, EEXIST, ENOSPC, ...), as the guest's kernel answered it."""

    def __init__(self, errno_: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno_


class UnknownUser(GuestFileError):
    """The guest has no account of that name (ENOENT): the data plane's 401."""


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


@dataclass(frozen=True)
class ImageInfo:
    image_id: str
    parent: str | None
    size_bytes: int
    created_at: float = 0.0
    # What a sandbox of this image (or of an image above it, a snapshot) starts with.
    start: StartCommand | None = None


@dataclass(frozen=True)
class StartCommand:
    """A template's start command: a process the runtime starts in every new sandbox of
    the image, as ``user`` in ``cwd`` with ``env`` (over the sandbox's env vars). A create
    returns once ``ready_port`` accepts connections inside the sandbox (None: at once) and
    fails, leaving nothing, when the command exits first or ``ready_timeout`` passes.
    ``ready_argv`` (E2B's ready command, a template build's) is run the same way, as
    ``user`` in ``cwd``, every ``READY_INTERVAL`` seconds until it exits 0; the start
    command may have exited 0 by then, not otherwise."""

    argv: tuple[str, ...]
    user: str = DEFAULT_USER
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    ready_port: int | None = None
    ready_timeout: float = 60.0
    ready_argv: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ConsoleLine:
    """A line a template's start or ready command wrote while its sandbox booted: when read
    (unix seconds), which command (``start``/``ready``), which stream, the text (cut)."""

    at: float
    source: str
    stream: Stream
    text: str


@dataclass(frozen=True)
class ImageBuild:
    """An image made by code instead of an archive: ``populate`` fills the new layer's
    root (a directory on the host, on top of ``parent``'s files); ``env`` is the environment
    of every process in its sandboxes (under the sandbox's env vars), ``workdir`` their
    working directory when they name none. Without a ``parent``, what ``populate`` makes is
    a whole root file system, finished as an imported archive is (the driver's mount points,
    the default user's account and home when it has none)."""

    image_id: str
    parent: str | None
    populate: Callable[[Path], None]
    env: Mapping[str, str] = field(default_factory=dict)
    start: StartCommand | None = None
    # Where processes started without a working directory begin in its sandboxes (E2B's
    # template WORKDIR, envd's default workdir); None: the user's home.
    workdir: str | None = None


class Runtime(Protocol):
    """A sandbox driver. Drivers are registered by name in :mod:`.registry`; every one
    passes ``tests/runtime/test_contract.py``."""

    name: str
    capabilities: frozenset[Capability]
    # The host this runtime holds sandboxes on (for the local driver, its root on this
    # machine): stable across restarts, distinct between hosts. The control plane records
    # it on every sandbox and acts only on its own (sandboxes/transitions.py, check_host).
    host_id: str

    @classmethod
    def capabilities_for(cls, options: Mapping[str, object]) -> frozenset[Capability]:
        """What an instance built with ``options`` will be able to do, known without
        building one (request validation needs no running runtime, and no root)."""
        ...

    def import_image(self, image_id: str, archive: IO[bytes]) -> ImageInfo:
        """A root file system tarball, read from ``archive``, becomes image ``image_id``."""
        ...

    def build_image(self, build: ImageBuild) -> ImageInfo:
        """Make image ``build.image_id`` (see :class:`ImageBuild`); an existing one is kept."""
        ...

    def squash_image(self, image_id: str, new_id: str) -> ImageInfo:
        """Image ``new_id``, parentless: ``image_id``'s files (its whole chain) as one layer,
        with the chain's environment and start command (a deep chain made shallow)."""
        ...

    def image_info(self, image_id: str) -> ImageInfo: ...
    def delete_image(self, image_id: str) -> bool: ...
    def list_images(self) -> builtins.list[str]: ...
    def create(self, spec: SandboxSpec) -> SandboxInfo: ...
    def status(self, sandbox_id: str) -> SandboxInfo: ...
    def list(self) -> builtins.list[SandboxInfo]: ...
    def live_ids(self) -> set[str]:
        """The ids of :meth:`list`'s sandboxes that are not dead (:attr:`Census.live`)."""
        ...

    def census(self) -> Census:
        """What :meth:`list` holds that is not dead, as cheaply as the driver can tell it
        (the lifecycle worker's reconcile asks on every tick)."""
        ...

    def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        """Pause a running sandbox: with ``memory`` its processes stop where they are
        (PauseMode.FULL); without, they end and its files are kept (FILESYSTEM_PAUSE).
        Pausing a paused sandbox raises RuntimeConflict."""
        ...

    def resume(self, sandbox_id: str, *, memory: bool = True) -> None:
        """Resume a paused sandbox: its processes continue, or, when it kept only its
        files (or ``memory`` is False: REBOOT_ON_RESUME), it cold-boots from them — a new
        init on the same disk, id, host name, access token and network rules, with the
        template's start command run again. A cold boot that fails leaves it paused with
        its files."""
        ...

    def snapshot(self, sandbox_id: str, image_id: str, *, memory: bool = False) -> ImageInfo:
        """Capture the sandbox's files as image ``image_id`` (idempotent by that id); with
        ``memory`` (MEMORY_SNAPSHOTS), its processes and their memory too: a sandbox
        created from the image continues them. The sandbox keeps running (or paused)."""
        ...

    def kill(self, sandbox_id: str) -> bool: ...

    def update_network(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Replace a running or paused sandbox's egress rules, live (NETWORK_RULES)."""
        ...

    def metrics(self, sandbox_id: str) -> Metrics: ...
    def limit_events(self, sandbox_id: str) -> LimitEvents:
        """The limits it met since its processes started; zeros when it has none."""

    def start_output(self, sandbox_id: str) -> builtins.list[ConsoleLine]:
        """What its start and ready commands wrote during its latest boot, until ready or
        failed: the newest lines, bounded (``e2bfacade.runtime.start``); SandboxNotFound."""
        ...

    def capacity(self) -> Capacity: ...
    def keep_warm(self, spec: SandboxSpec) -> None:
        """Keep ``spec.warm_pool`` sandboxes of ``spec``'s shape (its image, CPUs, memory,
        processes, disk, default user; not its id) started ahead: a create of that shape
        takes one instead of starting its own (and, for a template with a start command,
        instead of waiting for it). A driver without a pool does nothing. Pool sandboxes
        are no one's: never in :meth:`list`."""
        ...

    def warm_pools(self, specs: Iterable[SandboxSpec]) -> None:
        """Keep the pools of ``specs`` (:meth:`keep_warm`, each) and no other: end the idle
        pool sandboxes of every other shape, and those beyond a pool's size (a template
        whose pool was turned off or made smaller, one deleted or changed since)."""
        ...

    def discard_spares(self) -> None:
        """End the work done ahead for creates (spare launchers, pooled disks, pool
        sandboxes), for a service that stops: nothing of it is left on the host, and every
        sandbox stays. The next use fills the pools again. A driver with volumes lets go
        of what it holds of them on the host too (sandboxes keep theirs)."""
        ...

    def guest(self, sandbox_id: str) -> Guest:
        """The running sandbox's guest side (:class:`.guest.Guest`), resolved once: the
        sandbox's state is read here and never again by the Guest's calls. Raises
        SandboxNotFound, or RuntimeConflict when it is not running (paused, or dead). The
        Guest keeps what it resolved, so a caller resolves one per request, not per call."""
        ...

    def sweep(self, seen_live: Collection[str] = ()) -> builtins.list[str]:
        """Release what no live sandbox owns (whatever that means for the driver: dead
        sandboxes, half-made ones, leftover groups); returns the ids released. Safe beside
        running operations. ``seen_live``: ids the caller has just seen live (from
        :meth:`live_ids`), which the sweep need not look at again."""
        ...
