"""The runtime interface: what the control plane may ask of a sandbox backend.

Every operation is keyed by an id the control plane chose, and every mutating operation is
idempotent by that id. That is what lets the idempotency layer re-drive a create after a
crash: creating an id that already exists adopts it instead of allocating a second sandbox.
No method is ever called inside a database transaction.
"""

from __future__ import annotations

import builtins
import enum
import re
from dataclasses import dataclass, field
from typing import Protocol

# E2B's ids are "i" + 20 of [a-z0-9]; we accept any short URL-safe id and refuse everything
# that could escape a path (/, .., NUL) or a mount option (",", ":", "=").
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


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


class CreateRefused(SandboxRuntimeError):
    """Creation failed and everything it made was rolled back: provably nothing allocated."""


def check_id(value: str, what: str = "id") -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise InvalidId(
            f"{what} {value!r} is not URL-safe: use 1-63 characters of letters, digits, "
            "'-' and '_', starting with a letter or digit"
        )
    return value


class SandboxState(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    # Its directory is there but its init is gone (crashed, OOM-killed as a whole, host
    # rebooted): the reconciler reports it dead and cleans it up.
    DEAD = "dead"


@dataclass(frozen=True)
class SandboxSpec:
    sandbox_id: str
    image_id: str
    cpu_count: int = 2
    memory_mb: int = 512
    pids_max: int = 1024
    hostname: str = ""


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    image_id: str
    state: SandboxState
    init_pid: int
    cpu_count: int
    memory_mb: int
    pids_max: int
    created_at: float
    adopted: bool = False  # True when create() found the id already running


@dataclass(frozen=True)
class Metrics:
    cpu_count: int
    cpu_used_pct: float
    cpu_usage_ns: int
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int
    pids: int


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True)
class ImageInfo:
    image_id: str
    parent: str | None
    size_bytes: int
    host_binds: tuple[str, ...] = field(default_factory=tuple)
    created_at: float = 0.0


class Runtime(Protocol):
    def ensure_base_image(self) -> ImageInfo: ...
    def import_image(self, image_id: str, tar_path: str) -> ImageInfo: ...
    def image_info(self, image_id: str) -> ImageInfo: ...
    def delete_image(self, image_id: str) -> bool: ...
    def list_images(self) -> builtins.list[str]: ...
    def create(self, spec: SandboxSpec) -> SandboxInfo: ...
    def status(self, sandbox_id: str) -> SandboxInfo: ...
    def list(self) -> builtins.list[SandboxInfo]: ...
    def pause(self, sandbox_id: str) -> None: ...
    def resume(self, sandbox_id: str) -> None: ...
    def snapshot(self, sandbox_id: str, image_id: str) -> ImageInfo: ...
    def kill(self, sandbox_id: str) -> bool: ...
    def metrics(self, sandbox_id: str) -> Metrics: ...
    def exec(
        self,
        sandbox_id: str,
        argv: builtins.list[str],
        *,
        uid: int = 0,
        gid: int = 0,
        cwd: str = "/",
        stdin: bytes = b"",
        timeout: float = 30,
    ) -> ExecResult: ...
    def reap_orphans(self) -> builtins.list[str]: ...
