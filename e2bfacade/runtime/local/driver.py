"""The ``local`` driver: real Linux sandboxes on this host (state on disk: see
:mod:`.state`; images: :mod:`.images`; inside a guest: :mod:`.processes`, :mod:`.files`).

Isolation (docs/ARCHITECTURE.md, "The local driver"): a user namespace per sandbox with its
own host id range, and pid, mount, uts, ipc, net and cgroup namespaces; an overlay root
over idmapped read-only image layers, its writable layer on a disk of its own; cgroup
memory, pid and cpu limits; seccomp; a reaping PID 1; a veth link and nftables rules when
networking is configured.

A sandbox's files outlive its processes: a filesystem-only pause ends the processes and
keeps the disk, and a sandbox whose processes died under it (a crash, a host reboot) is
kept the same way, paused, with a reason. A resume cold-boots it: a new init on the same
disk, id range, host name and access token.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import secrets
import select
import shutil
import socket
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from e2bfacade.runtime.base import (
    CRASH_REASON,
    DEFAULT_USER,
    Capability,
    Capacity,
    Census,
    CreateRefused,
    EntryInfo,
    FileType,
    GuestFileError,
    ImageBuild,
    ImageInfo,
    ImageInUse,
    ImageNotFound,
    LimitExceeded,
    Metrics,
    NetworkPolicy,
    PauseMode,
    ProcessInfo,
    ProcessNotFound,
    ProcessSpec,
    PtySize,
    Runtime,
    RuntimeBusy,
    RuntimeConflict,
    RuntimeUnavailable,
    SandboxInfo,
    SandboxNotFound,
    SandboxRuntimeError,
    SandboxSpec,
    SandboxState,
    StartCommand,
    WatcherChanges,
    check_id,
)
from e2bfacade.runtime.local import build, disks, lxcfs, netns, trees, warm
from e2bfacade.runtime.local.cgroups import Cgroups, detect
from e2bfacade.runtime.local.disks import DiskPool
from e2bfacade.runtime.local.files import GuestFiles, KernelFile, lookup_user, open_guest_root
from e2bfacade.runtime.local.images import BASE_IMAGE, ImageStore, env_of, start_of
from e2bfacade.runtime.local.network import (
    NetworkConfig,
    SandboxNetwork,
    digest_of,
    load_config,
    save_config,
)
from e2bfacade.runtime.local.processes import (
    Agent,
    AgentProcess,
    AgentWatch,
    process_env,
    read_in_guest,
    start_items,
)
from e2bfacade.runtime.local.spares import CLAIM_PREFIX, Spares
from e2bfacade.runtime.local.state import (
    ID_RANGE,
    InitWatch,
    Layout,
    proc_starttime,
    write_json,
)

DEFAULT_SNAPSHOT_MAX_BYTES = 10 << 30
DEFAULT_DISK_MB: int = SandboxSpec("-", "-").disk_mb
log = logging.getLogger(__name__)
HOSTNAME_PATTERN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Where a start command finds the sandbox's env vars when they change after it started (a
# warm pool sandbox's claim): a JSON object; ``E2B_ENV_FILE`` in its environment names it.
GUEST_ENV_FILE = "/run/e2b/env.json"


@dataclass(frozen=True)
class LocalSandboxInfo(SandboxInfo):
    init_pid: int = 0  # the sandbox's PID 1 on the host


class LocalRuntime:
    name = "local"
    capabilities = frozenset(
        {
            Capability.PROCESSES,
            Capability.PTY,
            Capability.FILES,
            Capability.DISK_QUOTA,
            Capability.FILESYSTEM_PAUSE,
            Capability.REBOOT_ON_RESUME,
        }
    )

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
        if os.geteuid() != 0:
            raise RuntimeUnavailable(
                "the local sandbox runtime needs root (it creates namespaces, overlay mounts "
                "and cgroups); run the service as root or choose another SANDBOX_RUNTIME"
            )
        for ns in ("pid", "mnt", "uts", "ipc", "net"):
            if not os.path.exists(f"/proc/self/ns/{ns}"):
                raise RuntimeUnavailable(f"this kernel has no {ns} namespaces")
        if "overlay" not in Path("/proc/filesystems").read_text():
            raise RuntimeUnavailable("this kernel has no overlayfs (modprobe overlay)")
        self.root = root
        self.snapshot_max_bytes = snapshot_max_bytes
        self.layout = Layout(root, claim_ids=claim_ids)
        self.host_id = _host_id(root)
        self._init_watch = InitWatch()
        self.images = ImageStore(self.layout)
        # A group per runtime root, so a test runtime never touches another one's sandboxes.
        digest = digest_of(root)
        self.cgroups: Cgroups = detect(f"e2bfacade-{digest}", cgroup_version)
        self.images.migrate_xattrs()
        self._capacity = _host_capacity(root, host_reserve_mb)
        self.cgroups.set_total(
            memory_bytes=self._capacity.memory_mb << 20, pids_max=self._capacity.pids
        )
        # Work a create would otherwise wait for, done ahead in the background: launchers
        # already in their groups (spares.py) and formatted disks (disks.DiskPool), up to
        # ``spares`` of each (0: none; every create then does it all itself).
        self.spares = Spares(
            self.layout,
            self.cgroups,
            lambda: build.ensure_daemon(root),
            spares,
            version=build.source_hash(),
        )
        self.disk_pool = DiskPool(self.layout, spares)
        # Networking (network.py): given, or as the root was last configured (a restart, a
        # second process on the same root); none: sandboxes have their own loopback only.
        config = network or load_config(self.layout)
        self.network: SandboxNetwork | None = None
        if config is not None:
            self.network = SandboxNetwork(self.layout, config, digest)
            try:
                self.network.setup()
            except RuntimeUnavailable:
                if network is not None:
                    raise
                # As last configured, but its uplink is gone: this process can still release
                # rules and kill; new sandboxes get links with no way out (fail closed).
                log.warning("sandbox networking is not set up", exc_info=True)
            if network is not None:  # set up: from now on the root's (a refused one is not)
                save_config(self.layout, network)
            self.capabilities = self.capabilities | {
                Capability.INTERNET_ACCESS,
                Capability.NETWORK_RULES,
            }
        self._pool_sizes: dict[int, None] = {DEFAULT_DISK_MB: None}  # most recent last
        self._refilling = threading.Lock()
        # The warm pool (warm.py): per shape, sandboxes already started (``_pool_size``);
        # ``warm`` is the default for an image with a start command, and 0 turns every
        # pool off. The shapes this process has seen, most recent last.
        self.warm_target = warm if self.cgroups.version == 1 else 0
        self._warm_shapes: dict[str, SandboxSpec] = {}
        self._warming = threading.Lock()
        self._version = build.source_hash()

    # ----------------------------------------------------------------------------- images
    def image_info(self, image_id: str) -> ImageInfo:
        return self.images.info(image_id)

    def build_image(self, spec: ImageBuild) -> ImageInfo:
        check_id(spec.image_id, "image id")
        if spec.parent == BASE_IMAGE:
            self.images.ensure_base()
        return self.images.build(spec)

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

    # -------------------------------------------------------------------------- sandboxes
    def _info(self, state: Mapping[str, Any], adopted: bool = False) -> LocalSandboxInfo:
        sid = str(state["sandbox_id"])
        pid = int(state["init_pid"])
        mode, reason = None, None
        parked = state.get("paused")
        if parked:
            sandbox_state, mode, reason = (
                SandboxState.PAUSED,
                PauseMode.FILESYSTEM,
                parked["reason"],
            )
        elif proc_starttime(pid) != state["init_start"]:
            # Its processes ended without a pause: its files are kept (a pool sandbox's
            # are no one's), and it is paused until a resume cold-boots it.
            if "warm" not in state and disks.exists(self.layout.sandbox_dir(sid)):
                sandbox_state, mode, reason = (
                    SandboxState.PAUSED,
                    PauseMode.FILESYSTEM,
                    CRASH_REASON,
                )
            else:
                sandbox_state = SandboxState.DEAD
        elif self.cgroups.is_frozen(sid):
            sandbox_state, mode = SandboxState.PAUSED, PauseMode.FULL
        else:
            sandbox_state = SandboxState.RUNNING
        return LocalSandboxInfo(
            sandbox_id=sid,
            image_id=str(state["image_id"]),
            state=sandbox_state,
            cpu_count=int(state["cpu_count"]),
            memory_mb=int(state["memory_mb"]),
            pids_max=int(state["pids_max"]),
            created_at=float(state["created_at"]),
            adopted=adopted,
            envd_access_token=state.get("envd_access_token"),
            traffic_access_token=state.get("traffic_access_token"),
            default_user=str(state.get("default_user") or DEFAULT_USER),
            env_vars=dict(state.get("env_vars") or {}),
            pause_mode=mode,
            pause_reason=reason,
            init_pid=pid,
        )

    def create(self, spec: SandboxSpec) -> LocalSandboxInfo:
        """Start the sandbox ``spec.sandbox_id``, or adopt it if it already runs.

        Safe to retry and to call concurrently with the same id: exactly one sandbox
        results. A failure rolls back everything it made and raises :class:`CreateRefused`,
        so the caller knows that nothing was allocated.
        """
        check_id(spec.sandbox_id, "sandbox id")
        cap = self._capacity
        for name, value, low, high in (
            ("cpu_count", spec.cpu_count, 1, cap.cpus),
            ("memory_mb", spec.memory_mb, 16, cap.memory_mb),
            ("pids_max", spec.pids_max, 8, cap.pids),
            ("disk_mb", spec.disk_mb, disks.MIN_DISK_MB, cap.disk_mb),
        ):
            if not low <= value <= high:
                raise CreateRefused(f"{name} must be between {low} and {high}, got {value}")
        if spec.hostname and not HOSTNAME_PATTERN.fullmatch(spec.hostname):
            raise CreateRefused(f"hostname {spec.hostname!r} is not a valid host name")
        if self.network is None and not spec.network.is_isolated:
            raise CreateRefused(
                "this runtime has no networking configured (SANDBOX_UPLINK): sandboxes have "
                "their own loopback only"
            )
        for env_name, env_value in spec.env_vars.items():
            if not ENV_NAME.fullmatch(env_name) or "\0" in env_value:
                raise CreateRefused(f"environment variable {env_name!r} is not valid")
        with self.layout.locked("sandbox", spec.sandbox_id):
            state = self.layout.read_state(spec.sandbox_id)
            if state is not None:
                info = self._info(state, adopted=True)
                if info.state is not SandboxState.DEAD:
                    if info.image_id != spec.image_id:
                        raise RuntimeConflict(
                            f"sandbox {spec.sandbox_id} exists from image {info.image_id}, "
                            f"not {spec.image_id}"
                        )
                    if info.pause_mode is PauseMode.FILESYSTEM:
                        # Made, then its processes ended before its create was answered (a
                        # crash): it runs again on its files, as its create asked.
                        booted = self._boot(spec.sandbox_id, state)
                        self.replenish(spec.disk_mb)
                        return dataclasses.replace(booted, adopted=True)
                    return info
            # Dead, or half-made by a creator that crashed before writing state.json (we
            # hold the id's lock, so no creator is running): nobody was ever handed this
            # sandbox, so clear it and start afresh.
            self._destroy(spec.sandbox_id)
            if spec.image_id == BASE_IMAGE:
                self.images.ensure_base()
            chain = self.images.chain(spec.image_id)  # ImageNotFound before anything is made
            start = start_of(chain)
            key = warm.shape_key(spec, self._version)
            pooled = False
            if not warm.is_warm(spec.sandbox_id):
                pooled = self._pool_size(spec, start is not None) > 0
                if not pooled:
                    self._warm_shapes.pop(key, None)  # a pool turned off: refill it no more
            try:
                if pooled:
                    claimed = self._claim_warm(spec, key, start)
                    if claimed is not None:
                        self.keep_warm(spec)  # its replacement
                        return claimed
                info = self._start(spec, chain, key if warm.is_warm(spec.sandbox_id) else None)
                if start is not None:
                    self._run_start(spec.sandbox_id, start)
                if pooled:
                    self.keep_warm(spec)
                return info
            except BaseException as exc:
                self._destroy(spec.sandbox_id)
                if isinstance(exc, (CreateRefused, RuntimeUnavailable)):
                    raise
                if isinstance(exc, OSError):
                    raise CreateRefused(f"cannot create sandbox {spec.sandbox_id}: {exc}") from exc
                raise
            finally:
                # After, not during: parking a launcher holds the kernel's cgroup lock
                # through a migration, which the rename of this create's groups would wait on.
                self.replenish(spec.disk_mb)

    def _start(
        self, spec: SandboxSpec, chain: builtins.list[dict[str, Any]], warm_key: str | None
    ) -> LocalSandboxInfo:
        d = self.layout.sandbox_dir(spec.sandbox_id)
        id_base = self.layout.id_base_take(spec.sandbox_id)
        # What the guest's root builds its file system in, owned by the guest's root (host
        # id_base): the init works in it before it mounts anything (its staging mount
        # points live in a tmpfs it makes on stage/).
        d.mkdir(mode=0o700, exist_ok=True)
        for sub in ("rootfs", "stage"):
            (d / sub).mkdir(exist_ok=True)
            os.chown(d / sub, id_base, id_base)
        os.chown(d, id_base, id_base)
        # The writable layer, disk/upper, on a file system of its own (disks.py).
        if not self.disk_pool.claim(d, spec.disk_mb, owner=id_base):
            disks.attach(d, spec.disk_mb, owner=id_base)
        if self.network is not None:
            # Written into the new layer before the guest ever runs (a cold boot finds what
            # the guest left there instead).
            self._write_resolv_conf(d, id_base)
            self._write_trust(d, id_base, chain)
        state: dict[str, Any] = {
            "sandbox_id": spec.sandbox_id,
            "image_id": spec.image_id,
            "cpu_count": spec.cpu_count,
            "memory_mb": spec.memory_mb,
            "pids_max": spec.pids_max,
            "disk_mb": spec.disk_mb,
            "hostname": spec.hostname,
            "created_at": time.time(),
            "id_base": id_base,
            # What every process started in it gets (the directory is root-only, 0700).
            "env_vars": dict(spec.env_vars),
            "default_user": spec.default_user,
            "envd_access_token": spec.envd_access_token,
            "traffic_access_token": spec.traffic_access_token,
            "network": _policy_json(spec.network) if self.network is not None else None,
            # The template's environment, under env_vars (images.env_of).
            "image_env": env_of(chain),
        }
        if warm_key is not None:
            state["warm"] = warm_key
            state["warm_version"] = self._version
        return self._launch(spec, d, id_base, chain, state)

    def _launch(
        self,
        spec: SandboxSpec,
        d: Path,
        id_base: int,
        chain: builtins.list[dict[str, Any]],
        state: dict[str, Any],
    ) -> LocalSandboxInfo:
        """Start the sandbox's init on its prepared directory and disk, and write its state
        (with the init's identity): the commit point. A create and a cold boot alike."""
        binds = [b for meta in chain for b in meta.get("host_binds", ())]
        link = None
        if self.network is not None and state.get("network") is not None:
            # Rules first, then the link: the guest never has a moment of unfiltered egress.
            slot = (id_base - self.layout.id_block_base) // ID_RANGE
            self.network.apply(slot, spec.sandbox_id, spec.network)
            link = self.network.link(slot)
        # A launcher already in groups that become the sandbox's (spares.py), or one that
        # joins them itself (and waits for the kernel, on a quiet host).
        launcher = self.spares.claim(d)
        spare = Spares.group_of(launcher) if launcher is not None else None
        if spare is not None and not self.cgroups.adopt(spare, spec.sandbox_id):
            launcher = None
        self.cgroups.create(
            spec.sandbox_id,
            cpu_count=spec.cpu_count,
            memory_mb=spec.memory_mb,
            pids_max=spec.pids_max,
        )
        request = [
            f"rootfs={d / 'rootfs'}",
            "lower=" + ":".join(str(self.layout.image_dir(m["id"]) / "rootfs") for m in chain),
            f"hostname={spec.hostname or spec.sandbox_id}",
            f"seccomp={build.ensure_seccomp(self.root)}",
            f"dir={d}",
            f"idbase={id_base}",
            *(f"bind={b}:{b}" for b in binds),
            *(link.request() if link is not None else ()),
        ]
        proc_view = lxcfs.ensure(self.root)  # a live one at each launch: it may have died
        if proc_view is not None:
            request.append(f"lxcfs={proc_view}")
        # v2: born in its group (CLONE_INTO_CGROUP); v1: the launcher joins and leaves.
        into = self.cgroups.clone_into(spec.sandbox_id)
        joins = (
            [f"cgroupdir={into}"]
            if into is not None
            else [
                *(f"cgroup={p}" for p in self.cgroups.procs_files(spec.sandbox_id)),
                *(f"leave={p}" for p in self.cgroups.root_procs_files()),
            ]
        )
        pid = None
        if launcher is not None:
            pid = self._spare_create(spec.sandbox_id, launcher, request)
        if pid is None:
            pid = self._daemon_create(request + joins)
        start = proc_starttime(pid)
        if start is None:
            raise CreateRefused(f"sandbox {spec.sandbox_id} exited right after it started")
        state.pop("paused", None)
        state.update(init_pid=pid, init_start=start, booted_at=time.time())
        write_json(d / "state.json", state)  # the commit point: from here it runs
        return self._info(state)

    def _boot(self, sandbox_id: str, state: Mapping[str, Any]) -> LocalSandboxInfo:
        """Cold-boot a sandbox that kept only its files: a new init on its disk, its id
        range, host name, env vars, access tokens and network rules, then the template's
        start command. Caller holds the id's lock. On failure it is left as it was, paused
        with its files, and RuntimeBusy (or RuntimeConflict) says why."""
        d = self.layout.sandbox_dir(sandbox_id)
        id_base = self.layout.id_base_of(sandbox_id)
        if id_base is None or int(state["id_base"]) != id_base:
            raise RuntimeConflict(f"sandbox {sandbox_id} lost its id range: it cannot boot")
        reason = (state.get("paused") or {}).get("reason", CRASH_REASON)
        self._park(sandbox_id, state, reason)  # whatever a crash left of its processes
        try:
            chain = self.images.chain(str(state["image_id"]))
            disks.ensure_mounted(d)
            (d / "agent.sock").unlink(missing_ok=True)
            info = self._launch(self._spec_of(state), d, id_base, chain, dict(state))
            if (start := start_of(chain)) is not None:
                self._run_start(sandbox_id, start)
            return info
        except BaseException as exc:
            self._park(sandbox_id, state, reason)
            if isinstance(exc, ImageNotFound):
                raise RuntimeConflict(f"sandbox {sandbox_id} cannot boot: {exc.message}") from exc
            if isinstance(exc, (SandboxRuntimeError, OSError)):
                why = exc.message if isinstance(exc, SandboxRuntimeError) else str(exc)
                raise RuntimeBusy(f"sandbox {sandbox_id} did not boot: {why}") from exc
            raise

    def _park(self, sandbox_id: str, state: Mapping[str, Any], reason: str | None) -> None:
        """End every process of the sandbox and keep its files: paused, filesystem only
        (``reason``: why, when nobody asked). Its disk, id range and network slot stay; its
        groups, its rules and its processes' memory go. Caller holds the id's lock.

        Processes first, the record last: a crash in between leaves a sandbox whose init
        is dead and whose disk is there, which reads as paused just the same."""
        d = self.layout.sandbox_dir(sandbox_id)
        if self.cgroups.exists(sandbox_id):
            self.cgroups.kill_all(sandbox_id)
            if not self.cgroups.wait_empty(sandbox_id):
                raise RuntimeUnavailable(f"sandbox {sandbox_id}: processes survived SIGKILL")
            self.cgroups.remove(sandbox_id)
        for claim in d.glob(f"{CLAIM_PREFIX}*.sock"):
            self.spares.discard_group(Spares.group_of(claim))
        slot = self.layout.slot_of(sandbox_id)
        if self.network is not None and slot is not None:
            self.network.release(slot)
        disks.sync(d)  # what it wrote survives a power cut from here on
        parked = dict(state)
        parked.update(
            init_pid=0,
            init_start=0,
            paused={"mode": "filesystem", "reason": reason, "at": time.time()},
        )
        write_json(d / "state.json", parked)

    @staticmethod
    def _spec_of(state: Mapping[str, Any]) -> SandboxSpec:
        """The spec a sandbox was created with, from its state (for a cold boot)."""
        network = state.get("network") or {}
        dns = network.get("dns_servers")
        return SandboxSpec(
            sandbox_id=str(state["sandbox_id"]),
            image_id=str(state["image_id"]),
            cpu_count=int(state["cpu_count"]),
            memory_mb=int(state["memory_mb"]),
            pids_max=int(state["pids_max"]),
            disk_mb=int(state.get("disk_mb") or DEFAULT_DISK_MB),
            hostname=str(state.get("hostname") or ""),
            env_vars=dict(state.get("env_vars") or {}),
            default_user=str(state.get("default_user") or DEFAULT_USER),
            envd_access_token=state.get("envd_access_token"),
            traffic_access_token=state.get("traffic_access_token"),
            network=NetworkPolicy(
                allow_internet=bool(network.get("allow_internet")),
                allow_out=tuple(network.get("allow_out") or ()),
                deny_out=tuple(network.get("deny_out") or ()),
                dns_servers=None if dns is None else tuple(dns),
            ),
        )

    def _run_start(self, sandbox_id: str, start: StartCommand) -> None:
        """Start the template's start command; return once it is ready (StartCommand)."""
        proc = self.start_process(
            sandbox_id,
            ProcessSpec(
                argv=start.argv,
                user=start.user,
                cwd=start.cwd,
                env={**start.env, "E2B_ENV_FILE": GUEST_ENV_FILE},
                tag="start",
            ),
        )
        try:
            if start.ready_port is None:
                return
            deadline = time.monotonic() + start.ready_timeout
            while True:
                try:
                    self.connect_port(sandbox_id, start.ready_port, timeout=1.0).close()
                    return
                except GuestFileError:
                    pass
                try:
                    status = proc.wait(timeout=0.01)
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise CreateRefused(
                            f"the template's start command did not open port "
                            f"{start.ready_port} within {start.ready_timeout:g} s"
                        ) from None
                    continue
                said = b"".join(data for _, data in proc.output())[-800:]
                raise CreateRefused(
                    f"the template's start command exited (status {status.exit_code}) before "
                    f"port {start.ready_port} opened: {said.decode(errors='replace').strip()}"
                )
        finally:
            proc.close()

    def _pool_size(self, spec: SandboxSpec, has_start: bool) -> int:
        """How many pool sandboxes ``spec``'s shape keeps: the spec's own ``warm_pool``, or
        else ``warm`` for an image with a start command (``has_start``) and none for another;
        none at all when ``warm`` is 0 (``SANDBOX_WARM_POOL=0``, cgroup v2, a pool being
        discarded)."""
        if not self.warm_target:
            return 0
        if spec.warm_pool is not None:
            return max(0, min(spec.warm_pool, warm.MAX_PER_SHAPE))
        return self.warm_target if has_start else 0

    def _claim_warm(
        self, spec: SandboxSpec, key: str, start: StartCommand | None
    ) -> LocalSandboxInfo | None:
        """Take a ready pool sandbox of the create's shape as ``spec.sandbox_id`` (warm.py);
        None when there is none. Caller holds the id's lock; the id has no directory."""
        d = self.layout.sandbox_dir(spec.sandbox_id)
        for pool_dir in warm.ready(self.root / "sandboxes", key):
            # Its lock keeps the sweep off it while it moves (a lock stripe it shares with
            # our own id would block: then skip it).
            with self.layout.locked("sandbox", pool_dir.name, blocking=False) as got:
                if not got:
                    continue
                try:
                    os.rename(pool_dir, d)  # exactly one claimer wins
                except FileNotFoundError:
                    continue
            info = self._adopt_warm(spec, pool_dir.name, start)
            if info is not None:
                return info
            self._destroy(spec.sandbox_id)  # it had died: under both names
        return None

    def _adopt_warm(
        self, spec: SandboxSpec, pool_id: str, start: StartCommand | None
    ) -> LocalSandboxInfo | None:
        d = self.layout.sandbox_dir(spec.sandbox_id)
        state: dict[str, Any] = json.loads((d / "state.json").read_text())
        if self._info(state).state is not SandboxState.RUNNING:
            return None
        pid, init_start = int(state["init_pid"]), int(state["init_start"])
        if start is not None and start.ready_port is not None:
            try:  # its service may have died while it waited (killed, out of memory)
                netns.connect(pid, init_start, start.ready_port, 1.0).close()
            except GuestFileError:
                return None
        if not self.cgroups.adopt(pool_id, spec.sandbox_id):
            return None
        slot = self.layout.slot_move(pool_id, spec.sandbox_id)
        if slot is None:
            return None
        if self.network is not None:
            self.network.apply(slot, spec.sandbox_id, spec.network)
        netns.set_hostname(pid, init_start, spec.hostname or spec.sandbox_id)
        self.cgroups.create(
            spec.sandbox_id,
            cpu_count=spec.cpu_count,
            memory_mb=spec.memory_mb,
            pids_max=spec.pids_max,
        )
        if start is not None:
            # Where its start command reads the sandbox's env vars (E2B_ENV_FILE): it was
            # started before they were known. (Every other process gets them from the
            # state written below.)
            env = json.dumps(dict(spec.env_vars)).encode()
            with GuestFiles(pid, init_start, "root", int(state["id_base"])) as files:
                files.make_dir(os.path.dirname(GUEST_ENV_FILE))
                files.write(GUEST_ENV_FILE, [env])
        (d / warm.READY).unlink(missing_ok=True)
        state.pop("warm", None)
        state.pop("warm_version", None)
        state.update(
            sandbox_id=spec.sandbox_id,
            hostname=spec.hostname,
            created_at=time.time(),
            env_vars=dict(spec.env_vars),
            envd_access_token=spec.envd_access_token,
            traffic_access_token=spec.traffic_access_token,
            network=_policy_json(spec.network) if self.network is not None else None,
        )
        write_json(d / "state.json", state)  # the commit point, as for any create
        return self._info(state)

    def keep_warm(self, spec: SandboxSpec) -> None:
        """Keep ``_pool_size`` pool sandboxes of ``spec``'s shape ready (a background
        refill; at most one per process, one per shape across processes). By default only
        an image with a start command has a pool (a template's own: a snapshot of one gets
        none); ``spec.warm_pool`` sets it for any. This process remembers the
        ``warm.SHAPES_REMEMBERED`` most recent shapes."""
        if warm.is_warm(spec.sandbox_id) or not self._pool_size(spec, self._has_start(spec)):
            return
        key = warm.shape_key(spec, self._version)
        self._warm_shapes.pop(key, None)
        self._warm_shapes[key] = spec
        while len(self._warm_shapes) > warm.SHAPES_REMEMBERED:
            del self._warm_shapes[next(iter(self._warm_shapes))]
        if not self._warming.acquire(blocking=False):
            return
        threading.Thread(target=self._fill_warm, name="e2bfacade-warm", daemon=True).start()

    def _fill_warm(self) -> None:
        try:
            # Until a pass finds nothing to do: shapes may be added while it runs.
            while self.warm_target and self._fill_warm_pass():
                pass
        finally:
            self._warming.release()

    def _fill_warm_pass(self) -> bool:
        """One pool sandbox for each shape short of its target; whether any was made."""
        made = False
        for key, shape in reversed(list(self._warm_shapes.items())):
            with self.layout.locked("warm", key, blocking=False) as got:
                if not got:
                    continue  # another process fills this shape
                target = self._pool_size(shape, self._has_start(shape))
                if warm.count(self.root / "sandboxes", key) >= target:
                    continue
                pool_id = warm.new_id()
                try:
                    self.create(
                        dataclasses.replace(
                            shape,
                            sandbox_id=pool_id,
                            hostname="",
                            env_vars={},
                            envd_access_token=None,
                            traffic_access_token=None,
                            network=NetworkPolicy(),
                        )
                    )
                    (self.layout.sandbox_dir(pool_id) / warm.READY).touch()
                except Exception:  # noqa: BLE001 - the pool is an optimisation
                    # Forgotten until a create of that shape succeeds again: a template
                    # whose start command fails must not be retried in a loop.
                    log.exception("a warm pool sandbox could not be started")
                    self._warm_shapes.pop(key, None)
                    continue
                made = True
        return made

    def warm_pools(self, specs: Iterable[SandboxSpec]) -> None:
        """Keep the pools of ``specs`` and end every other idle pool sandbox (Runtime)."""
        wanted: dict[str, int] = {}
        for spec in specs:
            size = self._pool_size(spec, self._has_start(spec))
            key = warm.shape_key(spec, self._version)
            if size > wanted.get(key, 0):
                wanted[key] = size
                self.keep_warm(spec)
        for key in [k for k in self._warm_shapes if k not in wanted]:
            self._warm_shapes.pop(key, None)  # this process refills it no more
        for key, ready in warm.ready_by_shape(self.root / "sandboxes").items():
            for pool_dir in ready[wanted.get(key, 0) :]:
                # Under its lock, and only if it is still there: a create that took it
                # renamed it under that lock, and its groups still carry this name.
                with self.layout.locked("sandbox", pool_dir.name, blocking=False) as got:
                    if got and (pool_dir / warm.READY).exists():
                        self._destroy(pool_dir.name)

    def _has_start(self, spec: SandboxSpec) -> bool:
        """Whether the image itself has a start command (not one it inherits: a snapshot of
        such a template has none of its own; an image that is gone has none)."""
        return bool(self.images.read_or_empty(spec.image_id).get("start"))

    def discard_warm(self) -> None:
        """Stop filling the warm pool and end its sandboxes (a runtime being torn down)."""
        self.warm_target = 0
        with self._warming:
            for sid in sorted(self.layout.sandbox_ids()):
                if warm.is_warm(sid):
                    with self.layout.locked("sandbox", sid):
                        self._destroy(sid)

    @staticmethod
    def _payload(request: builtins.list[str]) -> bytes:
        if any("\0" in item for item in request):  # NUL separates items on the wire
            raise CreateRefused("a launch parameter contains a NUL byte")
        return b"".join(item.encode() + b"\0" for item in request) + b"\0"

    @staticmethod
    def _reply(s: socket.socket) -> str:
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
        return reply.decode(errors="replace").strip()

    def _daemon_create(self, request: builtins.list[str]) -> int:
        payload = self._payload(request)
        sock_path = build.ensure_daemon(self.root)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(sock_path))
            s.sendall(payload)
            text = self._reply(s)
        if text.startswith("OK "):
            return int(text[3:])
        raise CreateRefused(f"sandbox launch failed: {text.removeprefix('ERR ') or 'no reply'}")

    def _spare_create(
        self, sandbox_id: str, launcher: Path, request: builtins.list[str]
    ) -> int | None:
        """Launch through a parked launcher; None when it is gone (the caller falls back)."""
        payload = self._payload(request)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            try:
                s.connect(str(launcher))
                s.sendall(payload)
                text = self._reply(s)
            except OSError:
                text = ""
            if not text:
                # Dead (a reboot, its daemon killed), perhaps halfway: whatever it started
                # is in the sandbox's groups. End that and let the caller launch afresh.
                self.cgroups.kill_all(sandbox_id)
                if not self.cgroups.wait_empty(sandbox_id):
                    raise RuntimeUnavailable(f"sandbox {sandbox_id}: processes survived SIGKILL")
                return None
            if not text.startswith("OK "):
                raise CreateRefused(
                    f"sandbox launch failed: {text.removeprefix('ERR ') or 'no reply'}"
                )
            init, helper = (int(x) for x in text[3:].split())
            # The launcher is in the sandbox's groups until it exits, which it does once we
            # hang up: wait for that, so the init is the sandbox's only process on return.
            pidfd = os.pidfd_open(helper)
        try:
            select.select([pidfd], [], [], 5.0)
        finally:
            os.close(pidfd)
        return init

    def _destroy(self, sandbox_id: str) -> bool:
        """Kill every process of the sandbox and remove its groups and files. Caller holds
        the id's lock. Returns whether anything existed."""
        d = self.layout.sandbox_dir(sandbox_id)
        existed = d.exists() or self.cgroups.exists(sandbox_id)
        # Gone for everyone from here on, before its processes die: whoever sees one of them
        # end (a data-plane stream) asks, and learns that the sandbox ended, not the command.
        with contextlib.suppress(FileNotFoundError):
            (d / "state.json").rename(d / ".state.ending")
        # A pool sandbox whose claim a crash interrupted (warm.py) still has its groups or
        # its slot under its pool name: those go too.
        names = [sandbox_id]
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            origin = json.loads((d / ".state.ending").read_text())["sandbox_id"]
            if origin != sandbox_id and warm.is_warm(check_id(origin)):
                names.append(origin)
        for name in names:
            if self.cgroups.exists(name):
                self.cgroups.kill_all(name)
                if not self.cgroups.wait_empty(name):
                    raise RuntimeUnavailable(f"sandbox {sandbox_id}: processes survived SIGKILL")
                self.cgroups.remove(name)
        # No process of the sandbox is left: its rules, then its id range (and with it its
        # network slot), may go to the next one. Its link went with its network namespace.
        for name in names:
            if self.network is not None:
                slot = self.layout.slot_of(name)
                if slot is not None:
                    self.network.release(slot)
            self.layout.id_base_free(name)
        if d.exists():
            # A claimed launcher that never became the sandbox's (a crash between the
            # claim and the groups' rename) still sits in its spare groups.
            for claim in d.glob(f"{CLAIM_PREFIX}*.sock"):
                self.spares.discard_group(Spares.group_of(claim))
            # Rename first: a crash halfway through never leaves a half-deleted sandbox dir
            # that looks like a live one. What is in it is no one's now, and goes in the
            # background: the disk's unmount waits for an RCU grace period (about 2 ms).
            tomb = d.with_name(f".{sandbox_id}.{secrets.token_hex(4)}.deleting")
            os.rename(d, tomb)
            threading.Thread(target=_bury, args=(tomb,), name="e2bfacade-bury", daemon=True).start()
        return existed

    def status(self, sandbox_id: str) -> LocalSandboxInfo:
        state = self.layout.read_state(sandbox_id)
        if state is None:
            raise SandboxNotFound(f"sandbox {sandbox_id} does not exist")
        return self._info(state)

    def list(self) -> builtins.list[SandboxInfo]:
        out: builtins.list[SandboxInfo] = []
        for sid in sorted(self.layout.sandbox_ids()):
            state = self.layout.read_state(sid)
            if state is not None and "warm" not in state:  # the pool is no one's sandbox
                out.append(self._info(state))
        return out

    def _require(self, sandbox_id: str, *allowed: SandboxState) -> LocalSandboxInfo:
        info = self.status(sandbox_id)
        if info.state not in allowed:
            raise RuntimeConflict(f"sandbox {sandbox_id} is {info.state}")
        return info

    def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        """With ``memory``, freeze every process of the sandbox (memory stays as it is);
        without, end them and keep its files (:meth:`_park`). Not idempotent by design:
        pausing a paused sandbox raises RuntimeConflict (E2B answers 409)."""
        with self.layout.locked("sandbox", sandbox_id):
            self._require(sandbox_id, SandboxState.RUNNING)
            if not memory:
                self._park(sandbox_id, self._state(sandbox_id), None)
                return
            self.cgroups.freeze(sandbox_id)
            self._link_up(sandbox_id, False)  # no packet in or out while frozen

    def resume(self, sandbox_id: str, *, memory: bool = True) -> None:
        """Thaw a frozen sandbox, or cold-boot one that kept only its files (and, without
        ``memory``, a frozen one too, whose processes are ended first)."""
        with self.layout.locked("sandbox", sandbox_id):
            info = self._require(sandbox_id, SandboxState.PAUSED)
            if info.pause_mode is PauseMode.FULL and memory:
                self._link_up(sandbox_id, True)
                self.cgroups.thaw(sandbox_id)
                return
            if info.pause_mode is PauseMode.FULL:
                self._park(sandbox_id, self._state(sandbox_id), None)
            self._boot(sandbox_id, self._state(sandbox_id))
        self.replenish()

    def _state(self, sandbox_id: str) -> dict[str, Any]:
        state = self.layout.read_state(sandbox_id)
        if state is None:
            raise SandboxNotFound(f"sandbox {sandbox_id} does not exist")
        return state

    def _link_up(self, sandbox_id: str, up: bool) -> None:
        slot = self.layout.slot_of(sandbox_id)
        if self.network is not None and slot is not None:
            self.network.set_up(slot, up)

    def update_network(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Replace the sandbox's egress rules, in one step: connections already open stay
        open (as E2B), new ones follow the new rules."""
        check_id(sandbox_id, "sandbox id")
        with self.layout.locked("sandbox", sandbox_id):
            info = self._require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
            state = self.layout.read_state(sandbox_id) or {}
            slot = self.layout.slot_of(sandbox_id)
            if self.network is None or slot is None or state.get("network") is None:
                raise RuntimeConflict(f"sandbox {sandbox_id} has no network to update")
            if info.pause_mode is not PauseMode.FILESYSTEM:  # else: applied when it boots
                self.network.apply(slot, sandbox_id, policy)
            state["network"] = _policy_json(policy)
            write_json(self.layout.sandbox_dir(sandbox_id) / "state.json", state)

    def _write_trust(self, d: Path, owner: int, chain: builtins.list[dict[str, Any]]) -> None:
        """The image's CA bundle plus the configured extra CAs, in the sandbox's layer."""
        assert self.network is not None
        extra = self.network.config.extra_ca
        if extra is None:
            return
        bundle = "etc/ssl/certs/ca-certificates.crt"
        base = b""
        for meta in chain:  # the top layer first
            path = self.layout.image_dir(meta["id"]) / "rootfs" / bundle
            if path.is_file() and not path.is_symlink():
                base = path.read_bytes()
                break
        _write_guest_file(d, owner, bundle, base + b"\n" + Path(extra).read_bytes())

    def _write_resolv_conf(self, d: Path, owner: int) -> None:
        """The guest's resolvers (as E2B's templates have 8.8.8.8), in its own layer."""
        assert self.network is not None
        servers = self.network.config.dns_servers
        _write_guest_file(
            d, owner, "etc/resolv.conf", "".join(f"nameserver {ip}\n" for ip in servers).encode()
        )

    def snapshot(self, sandbox_id: str, image_id: str) -> ImageInfo:
        """Capture the sandbox's files as image ``image_id`` (idempotent by that id). The
        sandbox is frozen while its layer is copied, so the snapshot is consistent; sparse
        files stay sparse, and a layer over ``snapshot_max_bytes`` is refused."""
        check_id(image_id, "image id")
        with self.layout.locked("sandbox", sandbox_id):
            info = self._require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
            if self.images.exists(image_id):
                return self.images.info(image_id)
            if info.pause_mode is PauseMode.FILESYSTEM:
                disks.ensure_mounted(self.layout.sandbox_dir(sandbox_id))
            upper = self.layout.sandbox_dir(sandbox_id) / disks.MOUNT / "upper"

            def make(tmp: Path) -> dict[str, Any]:
                froze = info.state is SandboxState.RUNNING
                if froze:
                    self.cgroups.freeze(sandbox_id)
                try:
                    (tmp / "rootfs").rmdir()
                    trees.copy_layer(
                        upper,
                        tmp / "rootfs",
                        max_bytes=self.snapshot_max_bytes,
                        id_shift=-int((self.layout.read_state(sandbox_id) or {}).get("id_base", 0)),
                    )
                except trees.TreeTooLarge:
                    mib = self.snapshot_max_bytes >> 20
                    raise LimitExceeded(
                        f"sandbox {sandbox_id} holds more than the snapshot limit of {mib} MiB "
                        "of written files; delete some and try again"
                    ) from None
                finally:
                    if froze:
                        self.cgroups.thaw(sandbox_id)
                return {"parent": info.image_id, "host_binds": []}

            return self.images.publish(image_id, make)

    def kill(self, sandbox_id: str) -> bool:
        """Kill the sandbox and delete its files. Missing is fine: returns False."""
        check_id(sandbox_id, "sandbox id")
        with self.layout.locked("sandbox", sandbox_id):
            return self._destroy(sandbox_id)

    def metrics(self, sandbox_id: str) -> Metrics:
        info = self._require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
        d = self.layout.sandbox_dir(sandbox_id)
        if info.pause_mode is PauseMode.FILESYSTEM:  # no processes: nothing runs or is held
            used, total = disks.usage(d) if os.path.ismount(d / disks.MOUNT) else (0, 0)
            return Metrics(info.cpu_count, 0.0, 0, 0, info.memory_mb << 20, 0, used, total, 0)
        cpu_ns, mem_used, cache, limit = self.cgroups.stats(sandbox_id)
        # CPU % over the interval since the previous sample (or since start).
        now = time.time()
        sample_file = d / "cpu.sample"
        try:
            prev_t, prev_ns = (float(x) for x in sample_file.read_text().split())
        except (FileNotFoundError, ValueError):
            prev_t, prev_ns = info.created_at, 0.0
        sample_file.write_text(f"{now} {cpu_ns}")
        elapsed = max(now - prev_t, 1e-6)
        pct = 100.0 * (cpu_ns - prev_ns) / 1e9 / elapsed / info.cpu_count
        disk_used, disk_total = disks.usage(d)
        return Metrics(
            cpu_count=info.cpu_count,
            cpu_used_pct=round(max(0.0, min(pct, 100.0)), 2),
            cpu_usage_ns=cpu_ns,
            mem_used=mem_used,
            mem_total=limit,
            mem_cache=cache,
            disk_used=disk_used,
            disk_total=disk_total,
            pids=len(self.cgroups.pids(sandbox_id)),
        )

    def capacity(self) -> Capacity:
        return self._capacity

    def sweep(self, seen_live: Collection[str] = ()) -> builtins.list[str]:
        """Remove what no live sandbox owns: groups without a sandbox, sandboxes whose init
        died, directories a crashed creator left half-made. Safe beside running creates
        (an id whose lock is held is skipped)."""
        reaped = []
        groups = self.cgroups.names()  # one listing, for the sandboxes' groups and the spares'
        for sid in sorted(
            (self.layout.sandbox_ids() | self.cgroups.list_ids(groups)) - set(seen_live)
        ):
            # Looked at without its lock first: a live sandbox stays live (a dead one never
            # comes back), so only what looks dead or half-made pays for the lock, and is
            # looked at again under it. What the caller saw live it need not see again:
            # if it died since, the next sweep has it.
            if self._sweep_verdict(sid) == "keep":
                continue
            with self.layout.locked("sandbox", sid, blocking=False) as got:
                verdict = self._sweep_verdict(sid) if got else "keep"
                if verdict == "park":
                    # Its processes died under it: what they held goes, its files stay.
                    with contextlib.suppress(SandboxRuntimeError, OSError):
                        self._park(sid, self._state(sid), CRASH_REASON)
                elif verdict == "reap" and self._destroy(sid):
                    reaped.append(sid)
        for p in (self.root / "sandboxes").iterdir():
            if p.name.endswith(".deleting"):
                _bury(p)  # a crash (or an exit) came before the background removal did
        self.spares.sweep(self._claimed_spares, groups)
        if self.network is not None:
            self.network.sweep()
        self.disk_pool.sweep()
        self.replenish()
        return reaped

    def _sweep_verdict(self, sandbox_id: str) -> str:
        """What the sweep does with ``sandbox_id``: ``keep`` a created sandbox whose init
        lives or that is paused with its files; ``park`` one whose init died under it
        (its files are kept: :meth:`_park`); ``reap`` the rest — half-made, a pool sandbox
        whose init died or that older helper binaries made (which no create takes), one
        whose disk is gone."""
        state = self.layout.read_state_cached(sandbox_id)
        if state is None or state.get("warm_version", self._version) != self._version:
            return "reap"
        if state.get("paused"):
            return "keep"
        if proc_starttime(int(state["init_pid"])) == state["init_start"]:
            return "keep"
        if "warm" in state or not disks.exists(self.layout.sandbox_dir(sandbox_id)):
            return "reap"
        return "park"

    def live_ids(self) -> set[str]:
        return set(self.census().live)

    def census(self) -> Census:
        """The created sandboxes (no pool sandbox) that are not dead: those whose init
        lives (paused or not), and those ``kept`` with their files only (paused filesystem
        only, or their init died and their disk is there) — what :meth:`list` holds that is
        not dead, for the worker's reconcile, every tick. One directory walk, a stat per
        sandbox (its state is parsed again only when it changed), one poll of the inits'
        pidfds (:class:`InitWatch`, kept by this runtime object) and a stat per dead one."""
        inits, kept = {}, set()
        for sid in self.layout.sandbox_ids():
            state = self.layout.read_state_cached(sid)
            if state is None or "warm" in state:
                continue
            if state.get("paused"):
                kept.add(sid)
            else:
                inits[sid] = (int(state["init_pid"]), int(state["init_start"]))
        alive = self._init_watch.alive(inits)
        kept |= {s for s in inits.keys() - alive if disks.exists(self.layout.sandbox_dir(s))}
        return Census(live=frozenset(alive | kept), kept=frozenset(kept))

    def _claimed_spares(self) -> set[str]:
        claimed = set()
        for entry in os.scandir(self.root / "sandboxes"):
            if entry.name.startswith("."):
                continue  # a tomb, being removed in the background as we look
            try:
                names = os.listdir(entry.path)
            except (FileNotFoundError, NotADirectoryError):
                continue  # killed meanwhile
            claimed |= {
                Spares.group_of(Path(entry.path) / n)
                for n in names
                if n.startswith(CLAIM_PREFIX) and n.endswith(".sock")
            }
        return claimed

    def replenish(self, disk_mb: int | None = None) -> None:
        """Refill the spare launchers and the disk pool in a background thread (at most one
        per process; across processes a lock lets one fill at a time). The pool keeps the
        sizes of the most recent creates, up to four."""
        if disk_mb is not None:
            self._pool_sizes.pop(disk_mb, None)
            self._pool_sizes[disk_mb] = None
            while len(self._pool_sizes) > 4:
                del self._pool_sizes[next(iter(self._pool_sizes))]
        if not self.spares.target or not self._refilling.acquire(blocking=False):
            return

        def refill() -> None:
            try:
                self.spares.fill()
                for size in reversed(list(self._pool_sizes)):
                    self.disk_pool.fill(size)
            except Exception:  # noqa: BLE001 - a refill is an optimisation: log and go on
                log.exception("refilling spare launchers and disks failed")
            finally:
                self._refilling.release()

        threading.Thread(target=refill, name="e2bfacade-spares", daemon=True).start()

    def discard_spares(self) -> None:
        """End every parked launcher, pooled disk and pool sandbox (for a runtime being torn
        down)."""
        self.discard_warm()
        self.spares.closed = self.disk_pool.closed = True  # a running refill stops soon
        with self._refilling:
            self.spares.discard()
            self.disk_pool.discard()

    # ------------------------------------------------------------------------- data plane
    def _running_state(self, sandbox_id: str) -> tuple[LocalSandboxInfo, dict[str, Any]]:
        state = self.layout.read_state(sandbox_id)
        if state is None:
            raise SandboxNotFound(f"sandbox {sandbox_id} does not exist")
        info = self._info(state)
        if info.state is not SandboxState.RUNNING:
            # A paused sandbox's processes could not run, and its files are not to change.
            raise RuntimeConflict(f"sandbox {sandbox_id} is {info.state}")
        return info, state

    def _files(self, sandbox_id: str, user: str | None) -> GuestFiles:
        info, state = self._running_state(sandbox_id)
        return GuestFiles(
            info.init_pid,
            int(state["init_start"]),
            user or state.get("default_user") or DEFAULT_USER,
            int(state.get("id_base", 0)),  # 0: made before user namespaces, adopted
        )

    def start_process(self, sandbox_id: str, spec: ProcessSpec) -> AgentProcess:
        if not spec.argv or any("\0" in a for a in (*spec.argv, spec.tag or "")):
            raise CreateRefused("a process needs a command, without NUL bytes")
        info, state = self._running_state(sandbox_id)
        root_fd = open_guest_root(info.init_pid, int(state["init_start"]))
        try:
            account = lookup_user(root_fd, spec.user or state.get("default_user") or DEFAULT_USER)
        finally:
            os.close(root_fd)
        env = process_env(
            account, {**(state.get("image_env") or {}), **(state.get("env_vars") or {})}, spec
        )
        if any("\0" in k or "\0" in v or "=" in k for k, v in env.items()):
            raise CreateRefused("an environment variable contains a NUL byte or '=' in its name")
        cwd = spec.cwd or account.home
        if "\0" in cwd:
            raise CreateRefused("the working directory contains a NUL byte")
        items = start_items(account, spec, env, cwd)
        return self._agent(sandbox_id).start(items, pty=spec.pty is not None)

    def _agent(self, sandbox_id: str) -> Agent:
        self._running_state(sandbox_id)  # SandboxNotFound, or RuntimeConflict when paused
        return Agent(self.layout.sandbox_dir(sandbox_id) / "agent.sock")

    def list_processes(self, sandbox_id: str) -> builtins.list[ProcessInfo]:
        return [
            ProcessInfo(e.pid, e.args, e.user_env, e.cwd, e.tag, e.pty)
            for e in self._agent(sandbox_id).list()
        ]

    def connect_process(self, sandbox_id: str, pid: int) -> AgentProcess:
        with _by_pid(pid):
            return self._agent(sandbox_id).connect(pid)

    def process_stdin(self, sandbox_id: str, pid: int, data: bytes) -> None:
        with _by_pid(pid):
            self._agent(sandbox_id).write_stdin(pid, data)

    def process_close_stdin(self, sandbox_id: str, pid: int) -> None:
        with _by_pid(pid):
            self._agent(sandbox_id).close_stdin(pid)

    def process_signal(self, sandbox_id: str, pid: int, signum: int) -> None:
        with _by_pid(pid):
            self._agent(sandbox_id).signal(pid, signum)

    def process_resize(self, sandbox_id: str, pid: int, size: PtySize) -> None:
        with _by_pid(pid):
            self._agent(sandbox_id).resize(pid, size)

    def _watched(self, sandbox_id: str, path: str, user: str | None) -> str:
        """The guest path of a directory the user may watch (it must exist)."""
        with self._files(sandbox_id, user) as files:
            entry = files.stat(path)
            if entry.type is not FileType.DIRECTORY:
                raise GuestFileError(errno.ENOTDIR, f"path '{path}' is not a directory")
            return files.path(path)

    def watch_dir(
        self, sandbox_id: str, path: str, *, recursive: bool = False, user: str | None = None
    ) -> AgentWatch:
        guest = self._watched(sandbox_id, path, user)
        return self._agent(sandbox_id).watch(guest, recursive=recursive)

    def create_watcher(
        self,
        sandbox_id: str,
        path: str,
        *,
        recursive: bool = False,
        user: str | None = None,
        include_entry: bool = False,
    ) -> str:
        guest = self._watched(sandbox_id, path, user)
        agent = self._agent(sandbox_id)
        return f"w{agent.new_watcher(guest, recursive=recursive, include_entry=include_entry)}"

    def _watcher_number(self, watcher_id: str) -> int:
        if not (watcher_id.startswith("w") and watcher_id[1:].isdigit()):
            raise GuestFileError(errno.ENOENT, f"watcher '{watcher_id}' does not exist")
        return int(watcher_id[1:]) & 0xFFFFFFFF

    def watcher_events(self, sandbox_id: str, watcher_id: str) -> WatcherChanges:
        return self._agent(sandbox_id).watcher_changes(self._watcher_number(watcher_id))

    def remove_watcher(self, sandbox_id: str, watcher_id: str) -> None:
        self._agent(sandbox_id).remove_watcher(self._watcher_number(watcher_id))

    def connect_port(self, sandbox_id: str, port: int, *, timeout: float = 5.0) -> socket.socket:
        if not 0 < port < 65536:
            raise GuestFileError(errno.EINVAL, f"port {port} is not a TCP port")
        info, state = self._running_state(sandbox_id)
        return netns.connect(info.init_pid, int(state["init_start"]), port, timeout)

    def stat(self, sandbox_id: str, path: str, *, user: str | None = None) -> EntryInfo:
        with self._files(sandbox_id, user) as files:
            return files.stat(path)

    def list_dir(
        self, sandbox_id: str, path: str, *, user: str | None = None, depth: int = 1
    ) -> builtins.list[EntryInfo]:
        with self._files(sandbox_id, user) as files:
            return files.list_dir(path, depth)

    def make_dir(self, sandbox_id: str, path: str, *, user: str | None = None) -> bool:
        with self._files(sandbox_id, user) as files:
            return files.make_dir(path)

    def move(
        self, sandbox_id: str, source: str, destination: str, *, user: str | None = None
    ) -> EntryInfo:
        with self._files(sandbox_id, user) as files:
            return files.move(source, destination)

    def remove(self, sandbox_id: str, path: str, *, user: str | None = None) -> None:
        with self._files(sandbox_id, user) as files:
            files.remove(path)

    def read_file(
        self, sandbox_id: str, path: str, *, user: str | None = None, chunk_size: int = 65536
    ) -> Iterator[bytes]:
        with self._files(sandbox_id, user) as files:
            try:
                fd = files.open_read(path)
            except KernelFile as exc:  # the guest's /proc or /sys: the guest reads it
                account, kernel_file = files.account, exc.path
            else:
                return _chunks(fd, chunk_size)
        data = read_in_guest(self._agent(sandbox_id), account, kernel_file)
        return iter([data[i : i + chunk_size] for i in range(0, len(data), chunk_size)])

    def write_file(
        self,
        sandbox_id: str,
        path: str,
        chunks: Iterable[bytes],
        *,
        user: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> EntryInfo:
        with self._files(sandbox_id, user) as files:
            return files.write(path, chunks, metadata)


@contextlib.contextmanager
def _by_pid(pid: int) -> Iterator[None]:
    """The agent's "no such process" as the interface's ProcessNotFound."""
    if not 0 < pid < 1 << 31:
        raise ProcessNotFound(f"process {pid} does not exist")
    try:
        yield
    except GuestFileError as exc:
        if exc.errno == errno.ESRCH:
            raise ProcessNotFound(f"process {pid} is not running") from None
        raise


def _bury(tomb: Path) -> None:
    """Remove a killed sandbox's directory: its disk (one unmount), then the rest."""
    with contextlib.suppress(OSError):
        disks.detach(tomb)
        trees.remove_tree(tomb)


def _chunks(fd: int, chunk_size: int) -> Iterator[bytes]:
    with open(fd, "rb", buffering=0, closefd=True) as f:
        while chunk := f.read(chunk_size):
            yield chunk


def _host_capacity(root: Path, reserve_mb: int | None) -> Capacity:
    """This host's CPUs, and the memory and pids left for sandboxes after the host's own
    reserve (default: a fifth of memory, at least 1 GiB; half the kernel's thread limit)."""
    meminfo = Path("/proc/meminfo").read_text().split("\n")
    total_mb = next(int(line.split()[1]) >> 10 for line in meminfo if line.startswith("MemTotal:"))
    if reserve_mb is None:
        reserve_mb = max(1024, total_mb // 5)
    threads = int(Path("/proc/sys/kernel/threads-max").read_text())
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    disk = shutil.disk_usage(root)
    return Capacity(
        cpus=os.cpu_count() or 1,
        memory_mb=max(total_mb - reserve_mb, 64),
        pids=max(min(threads, pid_max) // 2, 64),
        disk_mb=disk.total >> 20,
    )


def _host_id(root: Path) -> str:
    """This root's host id: the machine's name and the root's path when the root was first
    used (kept in ``root/host-id``, so a renamed machine keeps its sandboxes)."""
    path = root / "host-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    tmp = root / f".host-id.{os.getpid()}.tmp"
    tmp.write_text(f"{socket.gethostname()}:{root}\n")
    with contextlib.suppress(FileExistsError):
        os.link(tmp, path)  # the first process to name it wins; the others read its name
    tmp.unlink()
    return path.read_text().strip()


def _conforms(runtime: LocalRuntime) -> Runtime:
    """Never called: mypy checks here that LocalRuntime implements the whole interface."""
    return runtime


def _write_guest_file(d: Path, owner: int, relative: str, data: bytes) -> None:
    """A file (0644) of guest root's in the new sandbox ``d``'s own layer, with its parent
    directories (0755): only before the guest runs, when nothing in the layer is its."""
    target = d / disks.MOUNT / "upper"
    parts = Path(relative).parts
    for part in parts[:-1]:
        target = target / part
        target.mkdir(mode=0o755, exist_ok=True)
        os.chown(target, owner, owner)
    out = target / parts[-1]
    out.write_bytes(data)
    os.chown(out, owner, owner)
    out.chmod(0o644)


def _policy_json(policy: NetworkPolicy) -> dict[str, Any]:
    return {
        "allow_internet": policy.allow_internet,
        "allow_out": list(policy.allow_out),
        "deny_out": list(policy.deny_out),
        "dns_servers": None if policy.dns_servers is None else list(policy.dns_servers),
    }
