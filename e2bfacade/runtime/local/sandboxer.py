"""The seam between the host runtime (driver.py: the shared Linux layer — layout, records,
images, disks, volumes, cgroups, network, pools, the agent client) and a way of running a
sandbox on it: a :class:`Sandboxer`, a strategy handed to the host, as crun's custom
handlers are (docs/ARCHITECTURE.md, "The host runtime and its sandboxers").

Two implement it: ``launcher/sandboxer.py`` (Linux namespaces made by sandboxd, the C
launcher: the ``local`` driver) and ``gvisor/sandboxer.py`` (gVisor's runsc: the ``gvisor``
driver). A sandboxer gets the host's parts (parts.py), never the host runtime itself: it
starts, ends, freezes or checkpoints the processes of a sandbox the host has prepared, and
says how the host reaches its guest; the host keeps every record, lock, disk, volume, slot
and pool, and the order of each lifecycle step (lifecycle.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from e2bfacade.runtime.base import Capability
from e2bfacade.runtime.local.guest.reach import GuestReach
from e2bfacade.runtime.local.parts import HostParts as HostParts
from e2bfacade.runtime.local.record import SandboxRecord
from e2bfacade.runtime.local.storage.image_meta import ImageMeta
from e2bfacade.runtime.local.storage.volumes import HostMount

# What the host runtime gives every sandboxer's sandboxes (a sandboxer adds its own).
HOST_CAPABILITIES = frozenset(
    {
        Capability.PROCESSES,
        Capability.PTY,
        Capability.FILES,
        Capability.DISK_QUOTA,
        Capability.FILESYSTEM_PAUSE,
        Capability.REBOOT_ON_RESUME,
        Capability.VOLUME_MOUNTS,
    }
)


@dataclass(frozen=True)
class Init:
    """A sandbox's init on the host, as its record names it (pid and kernel start time)."""

    pid: int
    start: int


class Sandboxer(Protocol):
    """One way of running sandboxes on the host runtime. Every method is called with the
    sandbox's id lock held, on a sandbox whose directory, disk, id range and record the host
    has made; the host commits the record (the init a start returns) and keeps the order."""

    name: str
    # The directory of the root it keeps its own state in (None: none): a root that holds
    # it was made by this sandboxer's driver (registry.drivers_for_root).
    state_dir: str | None
    # What the driver can do beyond the host layer's own (driver.HOST_CAPABILITIES).
    capabilities: frozenset[Capability]
    # Whether its sandboxes are started by spare launchers parked ahead (pools/spares.py),
    # and whether started sandboxes of a template's shape are pooled (pools/warm.py).
    spare_launchers: bool
    warm_pool: bool
    # Whether a pause with memory checkpoints the processes to the sandbox's directory
    # and ends them (else it freezes them where they are).
    checkpoints: bool

    @staticmethod
    def preflight(root: Path) -> None:
        """RuntimeUnavailable when this host cannot run it (checked before the host runtime
        makes anything of ``root``)."""
        ...

    def __init__(self, parts: HostParts) -> None: ...

    def disk_owner(self, id_base: int) -> int:
        """The host id a sandbox's disk stores for guest id 0, for the sandbox whose id
        range starts at ``id_base``."""
        ...

    def guest_ranges(self) -> list[ipaddress.IPv4Network]:
        """The ranges its sandboxes' guest sides take host-reachable addresses from, beside
        the network's (the host keeps every other account of the host out of them)."""
        ...

    def start(
        self, record: SandboxRecord, chain: Sequence[ImageMeta], volumes: Sequence[HostMount]
    ) -> Init:
        """Start the prepared sandbox (a create or a cold boot; for the first start of a
        sandbox whose image carries processes, ``chain[0].memory``, restore them). Raises
        CreateRefused or RuntimeBusy, having started nothing that :meth:`end` leaves."""
        ...

    def end(self, name: str) -> None:
        """After the host killed every process in the groups ``name``: what else holds the
        sandbox (or pool sandbox) ``name`` on the host (a container's state, a link, a
        mounted root tree)."""
        ...

    def freeze(self, record: SandboxRecord) -> None:
        """Stop the running sandbox's processes where they are, memory kept (not
        :attr:`checkpoints`)."""
        ...

    def thaw(self, record: SandboxRecord) -> None:
        """Continue what :meth:`freeze` stopped."""
        ...

    def checkpoint(self, record: SandboxRecord) -> None:
        """Save the running sandbox's processes and memory to its directory (
        :attr:`checkpoints`); the host then ends them and parks the sandbox, memory kept."""
        ...

    def restore(self, record: SandboxRecord, volumes: Sequence[HostMount]) -> Init:
        """Start the processes :meth:`checkpoint` saved, where they were."""
        ...

    def drop_memory(self, sandbox_id: str) -> None:
        """Forget what :meth:`checkpoint` saved of the sandbox (a cold boot, a filesystem
        pause and a resume drop it)."""
        ...

    def copy_memory(self, sandbox_id: str, image_dir: Path) -> None:
        """Put the sandbox's saved processes into a new image's directory (a memory
        snapshot: Capability.MEMORY_SNAPSHOTS)."""
        ...

    def reach(self, record: SandboxRecord, frozen: Callable[[], bool]) -> GuestReach:
        """How the host reaches the running sandbox's guest (guest/reach.py): where its
        agent listens, how its root is opened and its ports dialled, the host id its files
        store for guest root; ``frozen``: whether its groups are frozen now."""
        ...

    def sweep(self, seen_live: Collection[str]) -> None:
        """Release what it holds on the host for sandboxes that are gone (after the host's
        sweep)."""
        ...
