"""The host's lifecycle steps around a sandbox's processes (a sandboxer starts and ends
those: local/sandboxer.py): a new sandbox's directory, disk and record (:func:`prepare`);
the end of its processes that keeps its files (:func:`park`); and its end, files and all
(:func:`destroy`). Each takes the host's parts it uses (local/parts.py) and, where it ends
processes, the host's ``end`` of them (their groups killed, then the sandboxer's end)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from e2bfacade.runtime.base import RuntimeUnavailable, SandboxSpec, check_id
from e2bfacade.runtime.local.cgroups import Cgroups
from e2bfacade.runtime.local.guest import seed
from e2bfacade.runtime.local.net import tls
from e2bfacade.runtime.local.parts import HostParts
from e2bfacade.runtime.local.pools.spares import CLAIM_PREFIX, Spares
from e2bfacade.runtime.local.pools.warm import is_warm
from e2bfacade.runtime.local.record import Parked, SandboxRecord
from e2bfacade.runtime.local.storage import disks, trees
from e2bfacade.runtime.local.storage.image_meta import ImageMeta, env_of, workdir_of

# Kills every process of a sandbox (or pool sandbox) by name, and what holds them.
End = Callable[[str], None]


def prepare(
    parts: HostParts,
    spec: SandboxSpec,
    chain: Sequence[ImageMeta],
    *,
    disk_owner: Callable[[int], int],
    warm_key: str | None,
    now: float,
) -> SandboxRecord:
    """Make a new sandbox's directory and disk, and the record it launches with (saved by
    the launch: its commit point). ``disk_owner``: the sandboxer's (Sandboxer.disk_owner);
    ``warm_key``: a pool sandbox's shape."""
    layout, network = parts.layout, parts.network
    d = layout.sandbox_dir(spec.sandbox_id)
    id_base = layout.id_base_take(spec.sandbox_id)
    # What the guest's root builds its file system in, owned by the guest's root (host
    # id_base, or what the sandboxer stores for it): the init works in it before it mounts
    # anything (its staging mount points live in a tmpfs it makes on stage/).
    owner = disk_owner(id_base)
    d.mkdir(mode=0o700, exist_ok=True)
    for sub in ("rootfs", "stage"):
        (d / sub).mkdir(exist_ok=True)
        os.chown(d / sub, owner, owner)
    os.chown(d, owner, owner)
    # The writable layer, disk/upper, on a file system of its own (disks.py).
    if not parts.disk_pool.claim(d, spec.disk_mb, owner=owner):
        disks.attach(d, spec.disk_mb, owner=owner)
    if network is not None:
        seed.resolv_conf(d, owner, network.config.dns_servers)
        egress_ca = tls.ensure_ca(layout.root)  # the egress proxy's (transform rules)
        layers = [parts.images.layer(m.image_id) for m in chain]
        seed.trust(d, owner, layers, egress_ca, network.config.extra_ca)
    return SandboxRecord(
        sandbox_id=spec.sandbox_id,
        image_id=spec.image_id,
        id_base=id_base,
        cpu_count=spec.cpu_count,
        memory_mb=spec.memory_mb,
        pids_max=spec.pids_max,
        disk_mb=spec.disk_mb,
        created_at=now,
        hostname=spec.hostname,
        env_vars=dict(spec.env_vars),
        image_env={**(seed.TRUST_ENV if network is not None else {}), **env_of(chain)},
        image_workdir=workdir_of(chain),
        default_user=spec.default_user,
        envd_access_token=spec.envd_access_token,
        traffic_access_token=spec.traffic_access_token,
        mask_request_host=spec.mask_request_host,
        network=spec.network if network is not None else None,
        warm=warm_key,
        warm_version=parts.version if warm_key is not None else None,
        volume_mounts=spec.volume_mounts,
    )


def park(parts: HostParts, end: End, record: SandboxRecord, reason: str | None) -> SandboxRecord:
    """End every process of the sandbox and keep its files: paused, filesystem only
    (``reason``: why, when nobody asked). Its disk, id range and network slot stay; its
    groups, its rules and its processes' memory go. Caller holds the id's lock.

    Processes first, the record last: a crash in between leaves a sandbox whose init
    is dead and whose disk is there, which reads as parked just the same."""
    sid, d = record.sandbox_id, parts.layout.sandbox_dir(record.sandbox_id)
    end(sid)
    for claim in d.glob(f"{CLAIM_PREFIX}*.sock"):
        parts.spares.discard_group(Spares.group_of(claim))
    slot = parts.layout.slot_of(sid)
    if parts.network is not None and slot is not None:
        parts.network.release(slot)
    disks.sync(d)  # what it wrote survives a power cut from here on
    for volume_id in {m.volume_id for m in record.volume_mounts}:
        with contextlib.suppress(OSError):  # shared: others may write on; best effort
            parts.volumes.sync(volume_id)
    parked = record.replace(init_pid=0, init_start=0, parked=Parked(reason, time.time()))
    parked.save(d)
    return parked


def end_processes(cgroups: Cgroups, name: str) -> None:
    """Kill every process in the groups ``name`` and remove them."""
    if cgroups.exists(name):
        cgroups.kill_all(name)
        if not cgroups.wait_empty(name):
            raise RuntimeUnavailable(f"sandbox {name}: processes survived SIGKILL")
        cgroups.remove(name)


def destroy(parts: HostParts, end: End, sandbox_id: str) -> bool:
    """Kill every process of the sandbox and remove its groups and files. Caller holds
    the id's lock. Returns whether anything existed."""
    layout = parts.layout
    d = layout.sandbox_dir(sandbox_id)
    existed = d.exists() or parts.cgroups.exists(sandbox_id)
    # Gone for everyone from here on, before its processes die: whoever sees one of them
    # end (a data-plane stream) asks, and learns that the sandbox ended, not the command.
    with contextlib.suppress(FileNotFoundError):
        (d / "state.json").rename(d / ".state.ending")
    # A pool sandbox whose claim a crash interrupted (pools/warm.py) still has its groups
    # or its slot under its pool name: those go too.
    names = [sandbox_id]
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        origin = json.loads((d / ".state.ending").read_text())["sandbox_id"]
        if origin != sandbox_id and is_warm(check_id(origin)):
            names.append(origin)
    for name in names:
        end(name)
    # No process of the sandbox is left: its rules, then its id range (and with it its
    # network slot), may go to the next one. Its link went with its network namespace.
    for name in names:
        if parts.network is not None:
            slot = layout.slot_of(name)
            if slot is not None:
                parts.network.release(slot)
        layout.id_base_free(name)
    if d.exists():
        # A claimed launcher that never became the sandbox's (a crash between the
        # claim and the groups' rename) still sits in its spare groups.
        for claim in d.glob(f"{CLAIM_PREFIX}*.sock"):
            parts.spares.discard_group(Spares.group_of(claim))
        # Rename first: a crash halfway through never leaves a half-deleted sandbox dir
        # that looks like a live one. What is in it is no one's now, and goes in the
        # background: the disk's unmount waits for an RCU grace period (about 2 ms).
        tomb = d.with_name(f".{sandbox_id}.{secrets.token_hex(4)}.deleting")
        os.rename(d, tomb)
        threading.Thread(target=bury, args=(tomb,), name="e2bfacade-bury", daemon=True).start()
    return existed


def bury(tomb: Path) -> None:
    """Remove a killed sandbox's directory: its disk (one unmount), then the rest."""
    with contextlib.suppress(OSError):
        disks.detach(tomb)
        trees.remove_tree(tomb)
