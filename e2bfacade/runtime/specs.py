"""What the host's half of the interface (:class:`.base.Runtime`) takes and gives: ids,
sandbox and image specs and infos, states, capabilities, and the types both halves share.
Below every other module of the interface: it imports only the errors and the policy."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from e2bfacade.runtime.errors import InvalidId
from e2bfacade.runtime.policy import NetworkPolicy

# E2B's ids are "i" + 20 of [a-z0-9]; we accept any short URL-safe id and refuse everything
# that could escape a path (/, .., NUL) or a mount option (",", ":", "=").
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


# The image every driver provides out of the box (a usable Linux userland with ``user``
# and ``root``), built on first use. The ``base`` template points at it.
BUILTIN_IMAGE = "base"


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


class Stream(enum.StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"
    PTY = "pty"


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


@dataclass(frozen=True)
class VolumeMount:
    """One volume in a sandbox: the runtime's volume id at an absolute, clean guest path."""

    volume_id: str
    path: str
