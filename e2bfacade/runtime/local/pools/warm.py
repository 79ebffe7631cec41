"""The warm pool: sandboxes started ahead of time, so that a create takes one instead of
starting its own, and, for a template with a start command, one whose service is already
up instead of waiting for it. By default only templates with a start command have a pool
(``SANDBOX_WARM_POOL`` each); a template's ``warm_pool`` sets its own size, any template.

A pool sandbox is an ordinary sandbox named ``warm-<token>``, made for one *shape* (image,
CPUs, memory, processes, disk, default user): its ``state.json`` carries ``"warm": <shape
key>`` (so the runtime's ``list`` never shows it, and no team sees it in a listing or a
metric), and the file ``warm.ready`` appears in its directory once its start command is
ready. A create of that shape claims one:

1. under the create's id lock, rename ``sandboxes/warm-<token>`` to ``sandboxes/<id>``: a
   rename succeeds for exactly one claimer, across threads and processes;
2. rename its groups, move its id slot (and with it its network slot), apply the create's
   network rules, set its host name, write the create's env vars where its start command
   reads them (``E2B_ENV_FILE``);
3. write ``state.json`` under the new id: the commit point, as for any create.

A crash between 1 and 3 leaves a directory whose ``state.json`` names the pool sandbox:
never a live sandbox to anyone (``read_state`` refuses it). The create's retry, or the
sweep, destroys it under both names and the retry starts afresh: one sandbox per id, as
with every create.

Renaming groups needs cgroup v1; on v2 there is no pool (as there are no spares).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from e2bfacade.runtime.base import (
    GuestFileError,
    NetworkPolicy,
    SandboxSpec,
    SandboxState,
    StartCommand,
)
from e2bfacade.runtime.local.guest.files import GuestFiles
from e2bfacade.runtime.local.guest.syscalls import open_guest_root
from e2bfacade.runtime.local.net import netns
from e2bfacade.runtime.local.parts import HostParts
from e2bfacade.runtime.local.record import LocalSandboxInfo, SandboxRecord
from e2bfacade.runtime.start import GUEST_ENV_FILE

PREFIX = "warm-"
READY = "warm.ready"
MAX_PER_SHAPE = 16  # pool sandboxes of one shape, whatever a template asks for
SHAPES_REMEMBERED = 16  # shapes a process refills (most recent); older ones only drain


def new_id() -> str:
    return PREFIX + secrets.token_hex(8)


def is_warm(sandbox_id: str) -> bool:
    return sandbox_id.startswith(PREFIX)


def shape_key(spec: SandboxSpec, version: str) -> str:
    """What a pool sandbox must share with a create that takes it. The helper version is
    part of it: after an upgrade, a pool sandbox made by the old binaries serves no one."""
    shape = [
        spec.image_id,
        spec.cpu_count,
        spec.memory_mb,
        spec.pids_max,
        spec.disk_mb,
        spec.default_user,
        version,
    ]
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]


def ready(sandboxes: Path, key: str) -> list[Path]:
    """The ready pool sandboxes of ``key``, oldest first."""
    return ready_by_shape(sandboxes).get(key, [])


def ready_by_shape(sandboxes: Path) -> dict[str, list[Path]]:
    """Every ready pool sandbox, by shape key, oldest first (one directory walk)."""
    found: dict[str, list[tuple[float, Path]]] = {}
    for entry in os.scandir(sandboxes):
        if not is_warm(entry.name):
            continue
        try:
            with open(os.path.join(entry.path, "state.json")) as f:
                key = json.load(f).get("warm")
            made = os.stat(os.path.join(entry.path, READY)).st_mtime
        except (OSError, ValueError):
            continue  # starting, being claimed or removed
        if isinstance(key, str):
            found.setdefault(key, []).append((made, Path(entry.path)))
    return {key: [p for _, p in sorted(paths)] for key, paths in found.items()}


def count(sandboxes: Path, key: str) -> int:
    """Pool sandboxes of ``key``, ready or starting."""
    n = 0
    for entry in os.scandir(sandboxes):
        if not is_warm(entry.name):
            continue
        try:
            with open(os.path.join(entry.path, "state.json")) as f:
                if json.load(f).get("warm") == key:
                    n += 1
        except (OSError, ValueError):
            n += 1  # still being made: its state is not written yet
    return n


log = logging.getLogger(__name__)


class WarmPool:
    """The pools of one runtime: per shape, ``size(spec)`` pool sandboxes kept started, a
    background refill (at most one per process; one filler per shape across processes),
    and the claim a create makes of one. It takes the host's parts, and the host's own
    ``create`` (a pool sandbox is made as any sandbox is), ``destroy`` (caller holds the
    id's lock) and ``status`` (a record's sandbox as it is now)."""

    def __init__(
        self,
        parts: HostParts,
        default: int,
        *,
        create: Callable[[SandboxSpec], object],
        destroy: Callable[[str], bool],
        status: Callable[[SandboxRecord], LocalSandboxInfo],
        now: Callable[[], float],
    ) -> None:
        self.parts = parts
        self._create, self._destroy, self._status, self._now = create, destroy, status, now
        self.sandboxes = parts.root / "sandboxes"
        # The default pool of an image with a start command (SANDBOX_WARM_POOL); 0 turns
        # every pool off. Renaming groups needs cgroup v1: on v2 there is no pool.
        self.target = default if parts.cgroups.version == 1 else 0
        self.shapes: dict[str, SandboxSpec] = {}  # the shapes this process refills, newest last
        self.filling = threading.Lock()

    def key(self, spec: SandboxSpec) -> str:
        return shape_key(spec, self.parts.version)

    def size(self, spec: SandboxSpec, has_start: bool | None = None) -> int:
        """How many pool sandboxes ``spec``'s shape keeps: the spec's own ``warm_pool``, or
        else the default for an image with a start command and none for another; none at
        all when the default is 0 (``SANDBOX_WARM_POOL=0``, cgroup v2, a pool being
        discarded)."""
        if not self.target:
            return 0
        if spec.warm_pool is not None:
            return max(0, min(spec.warm_pool, MAX_PER_SHAPE))
        if has_start is None:
            has_start = self._has_start(spec)
        return self.target if has_start else 0

    def _has_start(self, spec: SandboxSpec) -> bool:
        """Whether the image itself has a start command (not one it inherits: a snapshot of
        such a template has none of its own; an image that is gone has none)."""
        meta = self.parts.images.read_or_none(spec.image_id)
        return meta is not None and meta.start is not None

    def forget(self, spec: SandboxSpec) -> None:
        """Refill ``spec``'s shape no more (its pool was turned off)."""
        self.shapes.pop(self.key(spec), None)

    def claim(self, spec: SandboxSpec, start: StartCommand | None) -> LocalSandboxInfo | None:
        """Take a ready pool sandbox of the create's shape as ``spec.sandbox_id``; None when
        there is none. Caller holds the id's lock; the id has no directory."""
        rt = self.parts
        d = rt.layout.sandbox_dir(spec.sandbox_id)
        for pool_dir in ready(self.sandboxes, self.key(spec)):
            # Its lock keeps the sweep off it while it moves (a lock stripe it shares with
            # our own id would block: then skip it).
            with rt.layout.locked("sandbox", pool_dir.name, blocking=False) as got:
                if not got:
                    continue
                try:
                    os.rename(pool_dir, d)  # exactly one claimer wins
                except FileNotFoundError:
                    continue
            info = self._adopt(spec, pool_dir.name, start)
            if info is not None:
                return info
            self._destroy(spec.sandbox_id)  # it had died: under both names
        return None

    def _adopt(
        self, spec: SandboxSpec, pool_id: str, start: StartCommand | None
    ) -> LocalSandboxInfo | None:
        rt = self.parts
        d = rt.layout.sandbox_dir(spec.sandbox_id)
        record = SandboxRecord.load(d)
        if record is None or self._status(record).state is not SandboxState.RUNNING:
            return None
        if start is not None and start.ready_port is not None:
            try:  # its service may have died while it waited (killed, out of memory)
                netns.connect(record.init_pid, record.init_start, start.ready_port, 1.0).close()
            except GuestFileError:
                return None
        if not rt.cgroups.adopt(pool_id, spec.sandbox_id):
            return None
        slot = rt.layout.slot_move(pool_id, spec.sandbox_id)
        if slot is None:
            return None
        if rt.network is not None:
            rt.network.apply(slot, spec.sandbox_id, spec.network)
        netns.set_hostname(record.init_pid, record.init_start, spec.hostname or spec.sandbox_id)
        rt.cgroups.create(
            spec.sandbox_id,
            cpu_count=spec.cpu_count,
            memory_mb=spec.memory_mb,
            pids_max=spec.pids_max,
        )
        if start is not None:
            # Where its start command reads the sandbox's env vars (E2B_ENV_FILE): it was
            # started before they were known. (Every other process gets them from the
            # record written below.)
            env = json.dumps(dict(spec.env_vars)).encode()
            root = open_guest_root(record.init_pid, record.init_start)
            with GuestFiles(root, "root", record.id_base) as files:
                files.make_dir(os.path.dirname(GUEST_ENV_FILE))
                files.write(GUEST_ENV_FILE, [env])
        (d / READY).unlink(missing_ok=True)
        adopted = record.replace(
            sandbox_id=spec.sandbox_id,
            hostname=spec.hostname,
            created_at=self._now(),
            env_vars=dict(spec.env_vars),
            envd_access_token=spec.envd_access_token,
            traffic_access_token=spec.traffic_access_token,
            mask_request_host=spec.mask_request_host,
            network=spec.network if rt.network is not None else None,
            warm=None,
            warm_version=None,
        )
        adopted.save(d)  # the commit point, as for any create
        return self._status(adopted)

    def keep(self, spec: SandboxSpec) -> None:
        """Keep ``size(spec)`` pool sandboxes of ``spec``'s shape ready (a background
        refill). This process remembers the ``SHAPES_REMEMBERED`` most recent shapes."""
        if is_warm(spec.sandbox_id) or not self.size(spec):
            return
        key = self.key(spec)
        self.shapes.pop(key, None)
        self.shapes[key] = spec
        while len(self.shapes) > SHAPES_REMEMBERED:
            del self.shapes[next(iter(self.shapes))]
        if not self.filling.acquire(blocking=False):
            return
        threading.Thread(target=self._fill, name="e2bfacade-warm", daemon=True).start()

    def _fill(self) -> None:
        try:
            # Until a pass finds nothing to do: shapes may be added while it runs.
            while self.target and self._fill_pass():
                pass
        finally:
            self.filling.release()

    def _fill_pass(self) -> bool:
        """One pool sandbox for each shape short of its target; whether any was made."""
        rt = self.parts
        made = False
        for key, shape in reversed(list(self.shapes.items())):
            with rt.layout.locked("warm", key, blocking=False) as got:
                if not got:
                    continue  # another process fills this shape
                if count(self.sandboxes, key) >= self.size(shape):
                    continue
                pool_id = new_id()
                try:
                    self._create(
                        dataclasses.replace(
                            shape,
                            sandbox_id=pool_id,
                            hostname="",
                            env_vars={},
                            envd_access_token=None,
                            traffic_access_token=None,
                            mask_request_host=None,
                            network=NetworkPolicy(),
                        )
                    )
                    (rt.layout.sandbox_dir(pool_id) / READY).touch()
                except Exception:  # noqa: BLE001 - the pool is an optimisation
                    # Forgotten until a create of that shape succeeds again: a template
                    # whose start command fails must not be retried in a loop.
                    log.exception("a warm pool sandbox could not be started")
                    self.shapes.pop(key, None)
                    continue
                made = True
        return made

    def keep_only(self, specs: Iterable[SandboxSpec]) -> None:
        """Keep the pools of ``specs`` and end every other idle pool sandbox (Runtime)."""
        wanted: dict[str, int] = {}
        for spec in specs:
            size = self.size(spec)
            key = self.key(spec)
            if size > wanted.get(key, 0):
                wanted[key] = size
                self.keep(spec)
        for key in [k for k in self.shapes if k not in wanted]:
            self.shapes.pop(key, None)  # this process refills it no more
        for key, pool_dirs in ready_by_shape(self.sandboxes).items():
            for pool_dir in pool_dirs[wanted.get(key, 0) :]:
                # Under its lock, and only if it is still there: a create that took it
                # renamed it under that lock, and its groups still carry this name.
                with self.parts.layout.locked("sandbox", pool_dir.name, blocking=False) as got:
                    if got and (pool_dir / READY).exists():
                        self._destroy(pool_dir.name)

    def discard(self) -> None:
        """Stop filling and end every pool sandbox (a runtime being torn down)."""
        self.target = 0
        with self.filling:
            for sid in sorted(self.parts.layout.sandbox_ids()):
                if is_warm(sid):
                    with self.parts.layout.locked("sandbox", sid):
                        self._destroy(sid)
