"""The host runtime: real Linux sandboxes on this host, the shared layer composed once (the
root's layout and records, images, disks, volumes, cgroups, network and pools: parts.py)
with a sandboxer (sandboxer.py), one way of running a sandbox, as its strategy. This module
is the wiring and the operations' entry (locks, checks); a sandbox's steps are
lifecycle.py's (docs/ARCHITECTURE.md, "The host runtime and its sandboxers").

A driver names a pairing: :class:`LocalRuntime` is the host runtime with the namespace
sandboxer (launcher/sandboxer.py), ``GvisorRuntime`` (e2bfacade/runtime/gvisor/driver.py)
with gVisor's. Neither adds nor replaces a method.
"""

from __future__ import annotations

import builtins
import ipaddress
import time
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import IO, ClassVar

from e2bfacade.runtime.base import (
    Capability,
    Capacity,
    Census,
    ConsoleLine,
    CreateRefused,
    ImageBuild,
    ImageInfo,
    ImageInUse,
    LimitEvents,
    Metrics,
    NetworkPolicy,
    PauseMode,
    Runtime,
    RuntimeConflict,
    RuntimeUnavailable,
    SandboxInfo,
    SandboxNotFound,
    SandboxSpec,
    SandboxState,
    check_id,
)
from e2bfacade.runtime.local import build, census, host, metrics, sweep
from e2bfacade.runtime.local.cgroups import detect
from e2bfacade.runtime.local.guest.handle import LocalGuest
from e2bfacade.runtime.local.launcher.sandboxer import NamespaceSandboxer
from e2bfacade.runtime.local.lifecycle import Lifecycle
from e2bfacade.runtime.local.net import accounts
from e2bfacade.runtime.local.net.network import digest_of, open_network
from e2bfacade.runtime.local.net.rules import NetworkConfig
from e2bfacade.runtime.local.parts import HostParts
from e2bfacade.runtime.local.pools.disks import DiskPool
from e2bfacade.runtime.local.pools.refill import Refill
from e2bfacade.runtime.local.pools.spares import Spares
from e2bfacade.runtime.local.pools.warm import WarmPool, is_warm
from e2bfacade.runtime.local.record import LocalSandboxInfo, SandboxRecord, check_spec
from e2bfacade.runtime.local.sandboxer import HOST_CAPABILITIES, Sandboxer
from e2bfacade.runtime.local.state import InitWatch, Layout
from e2bfacade.runtime.local.storage.image_meta import start_of
from e2bfacade.runtime.local.storage.images import BASE_IMAGE, ImageStore
from e2bfacade.runtime.local.storage.volume_files import LocalVolumeFiles
from e2bfacade.runtime.local.storage.volumes import VolumeStore
from e2bfacade.runtime.start import load_output
from e2bfacade.runtime.volumes import VolumeInfo

DEFAULT_SNAPSHOT_MAX_BYTES = 10 << 30


class HostRuntime:
    """The host layer with a sandboxer (``sandboxer_class``, set by each driver's class)."""

    sandboxer_class: ClassVar[type[Sandboxer]]
    sandboxer: Sandboxer
    name: str
    capabilities: frozenset[Capability]

    def __init_subclass__(cls) -> None:
        cls.name = cls.sandboxer_class.name
        cls.capabilities = HOST_CAPABILITIES | cls.sandboxer_class.capabilities

    @classmethod
    def capabilities_for(cls, options: Mapping[str, object]) -> frozenset[Capability]:
        """With networking configured (``network``), internet access and network rules."""
        if options.get("network") is None:
            return cls.capabilities
        return cls.capabilities | {Capability.INTERNET_ACCESS, Capability.NETWORK_RULES}

    def __init__(
        self,
        root: Path,
        cgroup_version: str = "auto",
        *,
        snapshot_max_bytes: int = DEFAULT_SNAPSHOT_MAX_BYTES,
        host_reserve_mb: int | None = None,
        spares: int = 2,
        network: NetworkConfig | None = None,
        warm: int = 0,
        claim_ids: bool = True,  # False: this runtime takes no host ids (state.Layout)
    ) -> None:
        """``spares``: launchers parked in their groups (for a sandboxer that uses them) and
        formatted disks kept ahead, each (0: none); ``warm``: the default pool of started
        sandboxes of an image with a start command (0: no pool; a sandboxer without pools
        has none)."""
        self.sandboxer_class.preflight(root)  # e.g. no runsc: before anything is made
        host.check_supported()
        self.root = root
        self.layout = Layout(root, claim_ids=claim_ids)
        self.host_id = host.host_id(root)
        self.version = build.source_hash()  # of the helper binaries: pool sandboxes carry it
        self._init_watch = InitWatch()
        self.images = ImageStore(self.layout)
        self.images.migrate_xattrs()
        self.volumes = VolumeStore(self.layout)
        # A group per runtime root, so a test runtime never touches another one's sandboxes.
        digest = digest_of(root)
        self.cgroups = detect(f"e2bfacade-{digest}", cgroup_version)
        self._capacity = host.capacity(root, host_reserve_mb)
        self.cgroups.set_total(
            memory_bytes=self._capacity.memory_mb << 20, pids_max=self._capacity.pids
        )
        kind = self.sandboxer_class
        # Work a create would otherwise wait for, done ahead in the background (pools/).
        self.spares = Spares(
            self.layout, self.cgroups, lambda: build.ensure_daemon(root),
            spares if kind.spare_launchers else 0, self.version,
        )  # fmt: skip
        self.disk_pool = DiskPool(self.layout, spares)
        self.refill = Refill(self.spares, self.disk_pool)
        # Networking (net/network.py): given, or as the root was last configured; none:
        # sandboxes have their own loopback only.
        self.network = open_network(self.layout, network, digest)
        if self.network is not None:
            self.capabilities = self.capabilities_for({"network": self.network.config})
        self.parts = HostParts(
            root, self.layout, self.images, self.volumes, self.cgroups, self.network,
            self.spares, self.disk_pool, self.refill, self.version, snapshot_max_bytes,
        )  # fmt: skip
        self.sandboxer = kind(self.parts)
        self.lifecycle = Lifecycle(self.parts, self.sandboxer)
        self.warm = WarmPool(
            self.parts, warm if kind.warm_pool else 0, create=self.create,
            destroy=self.destroy, status=self.lifecycle.info, now=self.now,
        )  # fmt: skip
        # Into a sandbox's ports only through the data plane: no other host account.
        accounts.install(digest, self.guest_ranges())

    def guest_ranges(self) -> builtins.list[ipaddress.IPv4Network]:
        """Every range this root's sandboxes' guest sides take their host-reachable
        addresses from: its network's, when configured, and its sandboxer's."""
        network = [self.network.net] if self.network is not None else []
        return [*network, *self.sandboxer.guest_ranges()]

    def disk_id_base(self, id_base: int) -> int:
        """The host id a sandbox's disk stores for guest id 0 (Sandboxer.disk_owner)."""
        return self.sandboxer.disk_owner(id_base)

    # ----------------------------------------------------------------------------- images
    def image_info(self, image_id: str) -> ImageInfo:
        return self.images.info(image_id)

    def build_image(self, spec: ImageBuild) -> ImageInfo:
        check_id(spec.image_id, "image id")
        if spec.parent == BASE_IMAGE:
            self.images.ensure_base()
        return self.images.build(spec)

    def squash_image(self, image_id: str, new_id: str) -> ImageInfo:
        check_id(new_id, "image id")
        return self.images.squash(image_id, new_id, max_bytes=self.parts.snapshot_max_bytes)

    def ensure_base_image(self) -> ImageInfo:
        return self.images.ensure_base()

    def import_image(self, image_id: str, archive: IO[bytes]) -> ImageInfo:
        check_id(image_id, "image id")
        return self.images.import_archive(image_id, archive)

    def delete_image(self, image_id: str) -> bool:
        with self.layout.locked("image", image_id):
            if not self.layout.image_dir(image_id).exists():
                return False
            children = self.images.children(image_id)
            users = [
                s.sandbox_id for s in self.list() if image_id in self.images.chain_ids(s.image_id)
            ]
            if children or users:
                raise ImageInUse(
                    f"image {image_id!r} is still used by "
                    + ", ".join([f"sandbox {u}" for u in users] + [f"image {c}" for c in children])
                )
            self.images.remove(image_id)
            return True

    def list_images(self) -> builtins.list[str]:
        return self.images.list()

    # ---------------------------------------------------------------------------- volumes
    def create_volume(self, volume_id: str, size_mb: int) -> VolumeInfo:
        return self.volumes.create(volume_id, size_mb, self._capacity.disk_mb)

    def volume_info(self, volume_id: str) -> VolumeInfo:
        return self.volumes.info(volume_id)

    def delete_volume(self, volume_id: str) -> bool:
        return self.volumes.delete(volume_id, self.volume_users)

    def volume_users(self, volume_id: str) -> set[str]:
        return census.volume_users(self.layout, self.cgroups, volume_id)

    def volume_ids(self, *, made_before: float | None = None) -> set[str]:
        return self.volumes.ids(made_before=made_before)

    def volume_files(self, volume_id: str) -> LocalVolumeFiles:
        return LocalVolumeFiles(self.volumes.ensure_mounted(volume_id))

    # ---------------------------------------------------------------------------- records
    @staticmethod
    def now() -> float:
        return time.time()

    def info(self, record: SandboxRecord, adopted: bool = False) -> LocalSandboxInfo:
        return self.lifecycle.info(record, adopted)

    def census(self) -> Census:
        return census.census(self.layout, self._init_watch)

    def status(self, sandbox_id: str) -> LocalSandboxInfo:
        return self.lifecycle.require(sandbox_id, *SandboxState)[1]

    def list(self) -> builtins.list[SandboxInfo]:
        out: builtins.list[SandboxInfo] = []
        for sid in sorted(self.layout.sandbox_ids()):
            record = self.layout.read_state(sid)
            if record is not None and not record.is_warm:  # the pool is no one's sandbox
                out.append(self.info(record))
        return out

    def live_ids(self) -> set[str]:
        return set(self.census().live)

    def guest(self, sandbox_id: str) -> LocalGuest:
        return self.lifecycle.guest(sandbox_id)

    def start_output(self, sandbox_id: str) -> builtins.list[ConsoleLine]:
        """What the start and ready commands wrote in the sandbox's latest boot, kept by
        Lifecycle.run_start (Runtime.start_output)."""
        if not (d := self.layout.sandbox_dir(sandbox_id)).is_dir():
            raise SandboxNotFound(f"sandbox {sandbox_id} does not exist")
        return load_output(d)

    # ------------------------------------------------------------------------ lifecycle
    def create(self, spec: SandboxSpec) -> LocalSandboxInfo:
        """Start the sandbox ``spec.sandbox_id``, or adopt it if it already exists.

        Safe to retry and to call concurrently with the same id: exactly one sandbox
        results. A failure rolls back everything it made and raises :class:`CreateRefused`,
        so the caller knows that nothing was allocated.
        """
        check_id(spec.sandbox_id, "sandbox id")
        check_spec(spec, self._capacity, self.network is not None)
        with self.layout.locked("sandbox", spec.sandbox_id):
            record = self.layout.read_state(spec.sandbox_id)
            if record is not None and (adopted := self.lifecycle.adopt(record, spec)) is not None:
                return adopted
            # Dead, or half-made by a creator that crashed before writing its record (we
            # hold the id's lock, so no creator is running): nobody was ever handed this
            # sandbox, so clear it and start afresh.
            self.destroy(spec.sandbox_id)
            if spec.image_id == BASE_IMAGE:
                self.images.ensure_base()
            chain = self.images.chain(spec.image_id)  # ImageNotFound before anything is made
            for mount in spec.volume_mounts:
                if not self.volumes.exists(mount.volume_id):
                    raise CreateRefused(f"volume {mount.volume_id} does not exist")
            start = start_of(chain)
            pooled = False
            # A pool sandbox never has volumes: one with them is made for its create.
            if not is_warm(spec.sandbox_id) and not spec.volume_mounts:
                pooled = self.warm.size(spec, start is not None) > 0
                if not pooled:
                    self.warm.forget(spec)  # a pool turned off: refill it no more
            try:
                if pooled and (claimed := self.warm.claim(spec, start)) is not None:
                    self.warm.keep(spec)  # its replacement
                    return claimed
                warm_key = self.warm.key(spec) if is_warm(spec.sandbox_id) else None
                info = self.lifecycle.make(spec, chain, warm_key)
                if start is not None and not chain[0].memory:  # a memory image runs its own
                    self.lifecycle.run_start(spec.sandbox_id, start)
                if pooled:
                    self.warm.keep(spec)
                return info
            except BaseException as exc:
                self.destroy(spec.sandbox_id)
                if isinstance(exc, (CreateRefused, RuntimeUnavailable)):
                    raise
                if isinstance(exc, OSError):
                    raise CreateRefused(f"cannot create sandbox {spec.sandbox_id}: {exc}") from exc
                raise
            finally:
                # After, not during: parking a launcher holds the kernel's cgroup lock
                # through a migration, which the rename of this create's groups would wait on.
                self.refill.after_create(spec.disk_mb)

    def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        """With ``memory``, stop every process of the sandbox where it is; without, end them
        and keep its files (Lifecycle.pause_memory, Lifecycle.park). Not idempotent by
        design: pausing a paused sandbox raises RuntimeConflict (E2B answers 409)."""
        with self.layout.locked("sandbox", sandbox_id):
            record, _ = self.lifecycle.require(sandbox_id, SandboxState.RUNNING)
            if not memory:
                self.lifecycle.park(record, None)
                return
            self.lifecycle.pause_memory(record)

    def resume(self, sandbox_id: str, *, memory: bool = True) -> None:
        """Continue a sandbox paused with its memory, or cold-boot one that kept only its
        files (and, without ``memory``, one paused with it too, whose memory goes first)."""
        with self.layout.locked("sandbox", sandbox_id):
            record, info = self.lifecycle.require(sandbox_id, SandboxState.PAUSED)
            if info.pause_mode is PauseMode.FULL and memory:
                self.lifecycle.resume_memory(record)
                return
            if info.pause_mode is PauseMode.FULL:
                record = self.lifecycle.park(record, None)
            self.lifecycle.boot(record)
        self.refill.after_create()

    def update_network(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Replace the sandbox's egress rules, live (Lifecycle.update_network)."""
        check_id(sandbox_id, "sandbox id")
        with self.layout.locked("sandbox", sandbox_id):
            self.lifecycle.update_network(sandbox_id, policy)

    def snapshot(self, sandbox_id: str, image_id: str, *, memory: bool = False) -> ImageInfo:
        """Capture the sandbox's files as image ``image_id``, idempotent by that id; with
        ``memory`` (MEMORY_SNAPSHOTS), its processes too (Lifecycle.snapshot)."""
        if memory and Capability.MEMORY_SNAPSHOTS not in self.capabilities:
            raise RuntimeConflict(f"the {self.name} driver's snapshots capture files only")
        check_id(image_id, "image id")
        with self.layout.locked("sandbox", sandbox_id):
            return self.lifecycle.snapshot(sandbox_id, image_id, memory=memory)

    def kill(self, sandbox_id: str) -> bool:
        """Kill the sandbox and delete its files. Missing is fine: returns False."""
        check_id(sandbox_id, "sandbox id")
        with self.layout.locked("sandbox", sandbox_id):
            return self.destroy(sandbox_id)

    def destroy(self, sandbox_id: str) -> bool:
        """Kill the sandbox and remove everything of it. Caller holds the id's lock."""
        return self.lifecycle.destroy(sandbox_id)

    def metrics(self, sandbox_id: str) -> Metrics:
        _, info = self.lifecycle.require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
        return metrics.sample(self.cgroups, self.layout.sandbox_dir(sandbox_id), info)

    def limit_events(self, sandbox_id: str) -> LimitEvents:
        return metrics.limit_events(self.cgroups, sandbox_id)

    def capacity(self) -> Capacity:
        return self._capacity

    def sweep(self, seen_live: Collection[str] = ()) -> builtins.list[str]:
        """The host's sweep (sweep.py), then what the sandboxer holds of sandboxes gone."""
        reaped = sweep.sweep(self.parts, seen_live, park=self.lifecycle.park, destroy=self.destroy)
        self.sandboxer.sweep(seen_live)
        return reaped

    # -------------------------------------------------------------------------- pools
    def keep_warm(self, spec: SandboxSpec) -> None:
        if not spec.volume_mounts:  # never pooled (create)
            self.warm.keep(spec)

    def warm_pools(self, specs: Iterable[SandboxSpec]) -> None:
        self.warm.keep_only([s for s in specs if not s.volume_mounts])

    def replenish(self, disk_mb: int | None = None) -> None:
        self.refill.after_create(disk_mb)

    def discard_spares(self) -> None:
        """End every parked launcher, pooled disk and pool sandbox, and unmount the volumes
        on the host (a runtime torn down, or a service that stops: running sandboxes keep
        their volumes, and the next use of one mounts it on the host again)."""
        self.warm.discard()
        self.refill.discard()
        self.volumes.release()


class LocalRuntime(HostRuntime):
    """``SANDBOX_RUNTIME=local``: the host runtime with the namespace sandboxer."""

    sandboxer_class = NamespaceSandboxer
    sandboxer: NamespaceSandboxer  # as built from sandboxer_class


def _conforms(runtime: HostRuntime) -> Runtime:
    """Never called: mypy checks here that the host runtime implements the interface."""
    return runtime
