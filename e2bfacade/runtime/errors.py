"""The runtime's errors: one family (:class:`SandboxRuntimeError`, whose ``message`` is meant
for the API caller), raised by both halves of the interface and by volumes."""

from __future__ import annotations


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


class GuestFileError(SandboxRuntimeError):
    """A file operation failed inside the guest; ``errno`` says why (ENOENT, EACCES,
    ENOTDIR, EISDIR, EEXIST, ENOSPC, ...), as the guest's kernel answered it."""

    def __init__(self, errno_: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno_


class UnknownUser(GuestFileError):
    """The guest has no account of that name (ENOENT): the data plane's 401."""


class VolumeNotFound(SandboxRuntimeError):
    pass


class VolumeInUse(SandboxRuntimeError):
    """A volume a live (running or paused) sandbox mounts cannot be deleted."""
