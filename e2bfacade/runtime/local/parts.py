"""The shared Linux layer of the host runtime, composed once (driver.py) and handed to the
parts that use it — the lifecycle steps (launcher/launch.py), the census, the sweep,
snapshots, the pools — and to the sandboxer (sandboxer.py): collaborators, never the
runtime itself, so no call bounces back into an overridable method."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from e2bfacade.runtime.local.cgroups import Cgroups
from e2bfacade.runtime.local.net.network import SandboxNetwork
from e2bfacade.runtime.local.pools.disks import DiskPool
from e2bfacade.runtime.local.pools.refill import Refill
from e2bfacade.runtime.local.pools.spares import Spares
from e2bfacade.runtime.local.state import Layout
from e2bfacade.runtime.local.storage.images import ImageStore
from e2bfacade.runtime.local.storage.volumes import VolumeStore


@dataclass(frozen=True)
class HostParts:
    """One root's parts: its layout (paths, locks, id slots), images, volumes, cgroups,
    network (None: sandboxes have their own loopback only), the pools of work done ahead
    (spare launchers, formatted disks, and their refill), the version of the helper
    binaries (pool sandboxes carry it) and the largest snapshot it takes."""

    root: Path
    layout: Layout
    images: ImageStore
    volumes: VolumeStore
    cgroups: Cgroups
    network: SandboxNetwork | None
    spares: Spares
    disk_pool: DiskPool
    refill: Refill
    version: str
    snapshot_max_bytes: int
