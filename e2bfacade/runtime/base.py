"""The runtime interface: what the control plane may ask of a sandbox backend — the host's
half, :class:`Runtime` (images, sandboxes' lifecycle, capacity, pools, the sweep). Its
types live in modules of their own, below it and free of cycles: the errors (errors.py),
what the host's calls take and give (specs.py), the guest's half, envd's (guest.py:
processes, files, watchers, ports, reached through :meth:`Runtime.guest`), volumes
(volumes.py), the network policy (policy.py) and the measures (measures.py). This module
re-exports them, so that a caller names the whole interface with one import.

Every operation is keyed by an id the control plane chose, and every mutating operation is
idempotent by that id. That is what lets the idempotency layer re-drive a create after a
crash: creating an id that already exists adopts it instead of allocating a second sandbox.
No method is ever called inside a database transaction.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Iterable, Mapping
from typing import IO, Protocol

from e2bfacade.runtime.errors import CreateRefused as CreateRefused
from e2bfacade.runtime.errors import GuestFileError as GuestFileError
from e2bfacade.runtime.errors import ImageInUse as ImageInUse
from e2bfacade.runtime.errors import ImageNotFound as ImageNotFound
from e2bfacade.runtime.errors import InvalidId as InvalidId
from e2bfacade.runtime.errors import LimitExceeded as LimitExceeded
from e2bfacade.runtime.errors import ProcessNotFound as ProcessNotFound
from e2bfacade.runtime.errors import RuntimeBusy as RuntimeBusy
from e2bfacade.runtime.errors import RuntimeConflict as RuntimeConflict
from e2bfacade.runtime.errors import RuntimeUnavailable as RuntimeUnavailable
from e2bfacade.runtime.errors import SandboxNotFound as SandboxNotFound
from e2bfacade.runtime.errors import SandboxRuntimeError as SandboxRuntimeError
from e2bfacade.runtime.errors import UnknownUser as UnknownUser
from e2bfacade.runtime.guest import DirWatch as DirWatch
from e2bfacade.runtime.guest import EntryInfo as EntryInfo
from e2bfacade.runtime.guest import ExitStatus as ExitStatus
from e2bfacade.runtime.guest import FileType as FileType
from e2bfacade.runtime.guest import FsChange as FsChange
from e2bfacade.runtime.guest import FsEvent as FsEvent
from e2bfacade.runtime.guest import Guest as Guest
from e2bfacade.runtime.guest import GuestProcess as GuestProcess
from e2bfacade.runtime.guest import ProcessInfo as ProcessInfo
from e2bfacade.runtime.guest import ProcessResult as ProcessResult
from e2bfacade.runtime.guest import ProcessSpec as ProcessSpec
from e2bfacade.runtime.guest import PtySize as PtySize
from e2bfacade.runtime.guest import WatcherChanges as WatcherChanges
from e2bfacade.runtime.measures import LimitEvents as LimitEvents
from e2bfacade.runtime.measures import Metrics as Metrics
from e2bfacade.runtime.policy import NetworkPolicy as NetworkPolicy
from e2bfacade.runtime.policy import UpstreamProxy as UpstreamProxy
from e2bfacade.runtime.specs import BUILTIN_IMAGE as BUILTIN_IMAGE
from e2bfacade.runtime.specs import CRASH_REASON as CRASH_REASON
from e2bfacade.runtime.specs import DEFAULT_USER as DEFAULT_USER
from e2bfacade.runtime.specs import ID_PATTERN as ID_PATTERN
from e2bfacade.runtime.specs import MIN_DISK_MB as MIN_DISK_MB
from e2bfacade.runtime.specs import Capability as Capability
from e2bfacade.runtime.specs import Capacity as Capacity
from e2bfacade.runtime.specs import Census as Census
from e2bfacade.runtime.specs import ConsoleLine as ConsoleLine
from e2bfacade.runtime.specs import ImageBuild as ImageBuild
from e2bfacade.runtime.specs import ImageInfo as ImageInfo
from e2bfacade.runtime.specs import PauseMode as PauseMode
from e2bfacade.runtime.specs import SandboxInfo as SandboxInfo
from e2bfacade.runtime.specs import SandboxSpec as SandboxSpec
from e2bfacade.runtime.specs import SandboxState as SandboxState
from e2bfacade.runtime.specs import StartCommand as StartCommand
from e2bfacade.runtime.specs import Stream as Stream
from e2bfacade.runtime.specs import VolumeMount as VolumeMount
from e2bfacade.runtime.specs import check_id as check_id


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
