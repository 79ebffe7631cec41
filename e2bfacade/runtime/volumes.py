"""Volumes: storage that outlives sandboxes and is shared between them (E2B's volumes).

A volume is a file system of its own on the host, of a fixed size limit, that the runtime
mounts into each sandbox naming it, live and shared: several running sandboxes see each
other's writes at once. Its files are stored with *guest* ids (0 for root, 1000 for
``user``), as image layers are; each sandbox's mount maps them into its own id range, so
``user`` owns what it writes in every sandbox. Kill, pause, resume, a snapshot and a crash
leave a volume as it is: a snapshot or a fork does not include it.

The content API (``VolumeFiles``) works on the same files from the host, resolving every
path inside the volume (symlinks, ``..`` and mount points never lead out of it; only
regular files are read or written), streaming with bounded memory. Its errors are
:class:`~e2bfacade.runtime.errors.GuestFileError` with the errno, as the guest's file
operations raise.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from e2bfacade.runtime.errors import VolumeInUse as VolumeInUse
from e2bfacade.runtime.errors import VolumeNotFound as VolumeNotFound
from e2bfacade.runtime.guest import FileType
from e2bfacade.runtime.specs import Capability
from e2bfacade.runtime.specs import VolumeMount as VolumeMount

if TYPE_CHECKING:
    from e2bfacade.runtime.base import Runtime

# At most this many volumes in one sandbox (each is one mount passed to the launcher).
MAX_MOUNTS_PER_SANDBOX = 8


@dataclass(frozen=True)
class VolumeInfo:
    volume_id: str
    size_mb: int  # its size limit: a guest or the content API meets ENOSPC past it
    used_bytes: int


@dataclass(frozen=True)
class VolumeEntry:
    """E2B's ``VolumeEntryStat``: ``path`` is absolute within the volume; ids are guest
    ids; times are seconds since the epoch; ``target`` is a symlink's (else None)."""

    name: str
    type: FileType
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: float
    mtime: float
    ctime: float
    target: str | None = None


class VolumeFiles(Protocol):
    """The content of one volume, as E2B's volume content API reaches it. Paths are
    absolute within the volume (``/`` is its root). ``uid``/``gid`` None: the guest's
    ``user`` (1000), who owns the volume's root, so a sandbox's ``user`` may change what the
    content API made."""

    def stat(self, path: str) -> VolumeEntry: ...

    def list_dir(self, path: str, depth: int = 1) -> list[VolumeEntry]: ...

    def make_dir(
        self,
        path: str,
        *,
        uid: int | None = None,
        gid: int | None = None,
        mode: int | None = None,
        force: bool = False,
    ) -> VolumeEntry:
        """``force``: make the missing parents too (else a missing parent is ENOENT) and
        accept a directory already there (else EEXIST), as E2B's."""
        ...

    def read_file(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Opens the file before returning (a missing file, a directory or anything that
        is not a regular file raises here, not while iterating)."""
        ...

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
        """Creates the file, or with ``force`` replaces it, atomically (a cut body leaves
        the old one); without ``force`` an existing path is EEXIST, as E2B's. ``force``
        makes the missing parents too."""
        ...

    def update(
        self, path: str, *, uid: int | None = None, gid: int | None = None, mode: int | None = None
    ) -> VolumeEntry: ...

    def remove(self, path: str) -> None:
        """A file, a symlink (not its target) or a directory with all it holds."""
        ...


class VolumeRuntime(Protocol):
    """What a driver with :attr:`Capability.VOLUME_MOUNTS` offers beside :class:`Runtime`.
    Every method is idempotent by the id the control plane chose."""

    def create_volume(self, volume_id: str, size_mb: int) -> VolumeInfo: ...

    def volume_info(self, volume_id: str) -> VolumeInfo: ...

    def delete_volume(self, volume_id: str) -> bool:
        """False when there was none; VolumeInUse while a live sandbox mounts it."""
        ...

    def volume_files(self, volume_id: str) -> VolumeFiles: ...

    def volume_ids(self, *, made_before: float | None = None) -> set[str]:
        """The volumes this host stores; with ``made_before`` (seconds since the epoch),
        only those whose storage was made before then."""
        ...


def volumes_of(runtime: Runtime) -> VolumeRuntime | None:
    """The runtime's volumes (:class:`VolumeRuntime`), when its driver has
    :attr:`Capability.VOLUME_MOUNTS`; None when it has none."""
    if Capability.VOLUME_MOUNTS not in runtime.capabilities:
        return None
    return cast(VolumeRuntime, runtime)
