"""Launching a sandbox, the Python side (the launcher's wire is client.py): a new sandbox's
directory, disk and record (:func:`prepare`); then its rules, groups and init, and its
record with the init's identity, the commit point (:func:`launch`) — for a create and a
cold boot (:func:`boot`) alike; the end of its processes that keeps its files
(:func:`park`); and its end, files and all (:func:`destroy`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from e2bfacade.runtime.base import (
    CRASH_REASON,
    CreateRefused,
    ImageNotFound,
    PauseMode,
    RuntimeBusy,
    RuntimeConflict,
    RuntimeUnavailable,
    SandboxRuntimeError,
    SandboxSpec,
    SandboxState,
    check_id,
)
from e2bfacade.runtime.local import build, lxcfs
from e2bfacade.runtime.local.guest import seed
from e2bfacade.runtime.local.ids import ID_RANGE
from e2bfacade.runtime.local.net import tls
from e2bfacade.runtime.local.pools.spares import CLAIM_PREFIX, Spares
from e2bfacade.runtime.local.pools.warm import is_warm
from e2bfacade.runtime.local.record import LocalSandboxInfo, Parked, SandboxRecord
from e2bfacade.runtime.local.state import proc_starttime
from e2bfacade.runtime.local.storage import disks, trees
from e2bfacade.runtime.local.storage.image_meta import (
    ImageMeta,
    env_of,
    host_binds_of,
    start_of,
    workdir_of,
)
from e2bfacade.runtime.local.storage.volumes import HostMount

# Mounts the launcher hands the init in one message (launcher/c/launcher.h MAX_FDS): the
# image's layers, the host binds, lxcfs's and the volumes.
MAX_FDS = 32

if TYPE_CHECKING:
    from e2bfacade.runtime.local.driver import LocalRuntime


def prepare(rt: LocalRuntime, spec: SandboxSpec, chain: list[ImageMeta]) -> LocalSandboxInfo:
    """Make a new sandbox's directory and disk, and its record, then launch it."""
    d = rt.layout.sandbox_dir(spec.sandbox_id)
    id_base = rt.layout.id_base_take(spec.sandbox_id)
    # What the guest's root builds its file system in, owned by the guest's root (host
    # id_base, or what the driver stores for it): the init works in it before it mounts
    # anything (its staging mount points live in a tmpfs it makes on stage/).
    owner = rt.disk_id_base(id_base)
    d.mkdir(mode=0o700, exist_ok=True)
    for sub in ("rootfs", "stage"):
        (d / sub).mkdir(exist_ok=True)
        os.chown(d / sub, owner, owner)
    os.chown(d, owner, owner)
    # The writable layer, disk/upper, on a file system of its own (disks.py).
    if not rt.disk_pool.claim(d, spec.disk_mb, owner=owner):
        disks.attach(d, spec.disk_mb, owner=owner)
    if rt.network is not None:
        seed.resolv_conf(d, owner, rt.network.config.dns_servers)
        egress_ca = tls.ensure_ca(rt.layout.root)  # the egress proxy's (transform rules)
        layers = [rt.images.layer(m.image_id) for m in chain]
        seed.trust(d, owner, layers, egress_ca, rt.network.config.extra_ca)
    record = SandboxRecord(
        sandbox_id=spec.sandbox_id,
        image_id=spec.image_id,
        id_base=id_base,
        cpu_count=spec.cpu_count,
        memory_mb=spec.memory_mb,
        pids_max=spec.pids_max,
        disk_mb=spec.disk_mb,
        created_at=rt.now(),
        hostname=spec.hostname,
        env_vars=dict(spec.env_vars),
        image_env={**(seed.TRUST_ENV if rt.network is not None else {}), **env_of(chain)},
        image_workdir=workdir_of(chain),
        default_user=spec.default_user,
        envd_access_token=spec.envd_access_token,
        traffic_access_token=spec.traffic_access_token,
        mask_request_host=spec.mask_request_host,
        network=spec.network if rt.network is not None else None,
        warm=rt.warm.key(spec) if is_warm(spec.sandbox_id) else None,
        warm_version=rt.version if is_warm(spec.sandbox_id) else None,
        volume_mounts=spec.volume_mounts,
    )
    return rt.launch(record, chain)


def launch(rt: LocalRuntime, record: SandboxRecord, chain: list[ImageMeta]) -> LocalSandboxInfo:
    """Start the sandbox's init on its prepared directory and disk, and write its record
    (with the init's identity): the commit point. A create and a cold boot alike."""
    binds = host_binds_of(chain)
    mounts = len(chain) + len(binds) + 1 + len(record.volume_mounts)
    if mounts > MAX_FDS:
        raise CreateRefused(
            f"sandbox {record.sandbox_id} would need {mounts} mounts (image layers, host "
            f"binds and volumes), more than the {MAX_FDS} one sandbox may have"
        )
    with rt.volumes.held(record.volume_mounts) as volumes:
        return _launch(rt, record, chain, binds, volumes)


def _launch(
    rt: LocalRuntime,
    record: SandboxRecord,
    chain: list[ImageMeta],
    binds: list[str],
    volumes: list[HostMount],
) -> LocalSandboxInfo:
    sid, d = record.sandbox_id, rt.layout.sandbox_dir(record.sandbox_id)
    link = None
    if rt.network is not None and record.network is not None:
        # Rules first, then the link: the guest never has a moment of unfiltered egress.
        slot = (record.id_base - rt.layout.id_block_base) // ID_RANGE
        rt.network.apply(slot, sid, record.network)
        link = rt.network.link(slot)
    # A launcher already in groups that become the sandbox's (pools/spares.py), or one
    # that joins them itself (and waits for the kernel, on a quiet host).
    launcher = rt.spares.claim(d)
    spare = Spares.group_of(launcher) if launcher is not None else None
    if spare is not None and not rt.cgroups.adopt(spare, sid):
        launcher = None
    rt.cgroups.create(
        sid, cpu_count=record.cpu_count, memory_mb=record.memory_mb, pids_max=record.pids_max
    )
    request = [
        f"rootfs={d / 'rootfs'}",
        "lower=" + ":".join(str(rt.images.layer(m.image_id)) for m in chain),
        f"hostname={record.hostname or sid}",
        f"seccomp={build.ensure_seccomp(rt.root)}",
        f"dir={d}",
        f"idbase={record.id_base}",
        *(f"bind={b}:{b}" for b in binds),
        *(f"volume={v.source}:{v.target}" for v in volumes),
        *(link.request() if link is not None else ()),
    ]
    proc_view = lxcfs.ensure(rt.root)  # a live one at each launch: it may have died
    if proc_view is not None:
        request.append(f"lxcfs={proc_view}")
    pid = None
    if launcher is not None:
        pid = rt.launcher.launch_spare(sid, launcher, request)
    if pid is None:
        # v2: born in its group (CLONE_INTO_CGROUP); v1: the launcher joins and leaves.
        into = rt.cgroups.clone_into(sid)
        joins = (
            [f"cgroupdir={into}"]
            if into is not None
            else [
                *(f"cgroup={p}" for p in rt.cgroups.procs_files(sid)),
                *(f"leave={p}" for p in rt.cgroups.root_procs_files()),
            ]
        )
        pid = rt.launcher.launch(request + joins)
    start = proc_starttime(pid)
    if start is None:
        raise CreateRefused(f"sandbox {sid} exited right after it started")
    launched = record.replace(init_pid=pid, init_start=start, booted_at=rt.now(), parked=None)
    launched.save(d)  # the commit point: from here it runs
    return rt.info(launched)


def adopt(rt: LocalRuntime, record: SandboxRecord, spec: SandboxSpec) -> LocalSandboxInfo | None:
    """A create of an id that has a record: the sandbox it names, when it is not dead and
    was made from the same image with the same volumes (RuntimeConflict otherwise); None
    when it is dead (the caller makes it afresh). Caller holds the id's lock."""
    info = rt.info(record, adopted=True)
    if info.state is SandboxState.DEAD:
        return None
    if info.image_id != spec.image_id:
        raise RuntimeConflict(
            f"sandbox {spec.sandbox_id} exists from image {info.image_id}, not {spec.image_id}"
        )
    if record.volume_mounts != tuple(spec.volume_mounts):
        raise RuntimeConflict(f"sandbox {spec.sandbox_id} exists with other volume mounts")
    if info.pause_mode is PauseMode.FILESYSTEM:
        # Made, then its processes ended before its create was answered (a crash): it runs
        # again on its files, as its create asked.
        booted = rt.boot(record)
        rt.refill.after_create(spec.disk_mb)
        return dataclasses.replace(booted, adopted=True)
    return info


def boot(rt: LocalRuntime, record: SandboxRecord) -> LocalSandboxInfo:
    """Cold-boot a sandbox that kept only its files: a new init on its disk, its id
    range, host name, env vars, access tokens and network rules, then the template's
    start command. Caller holds the id's lock. On failure it is left as it was, parked
    with its files, and RuntimeBusy (or RuntimeConflict) says why."""
    sid = record.sandbox_id
    d = rt.layout.sandbox_dir(sid)
    if rt.layout.id_base_of(sid) != record.id_base:
        raise RuntimeConflict(f"sandbox {sid} lost its id range: it cannot boot")
    reason = record.parked.reason if record.parked is not None else CRASH_REASON
    parked = rt.park(record, reason)  # whatever a crash left of its processes goes
    try:
        chain = rt.images.chain(record.image_id)
        disks.ensure_mounted(d)
        (d / "agent.sock").unlink(missing_ok=True)
        info = rt.launch(parked, chain)
        if (start := start_of(chain)) is not None:
            rt.run_start(sid, start)
        return info
    except BaseException as exc:
        rt.park(parked, reason)
        if isinstance(exc, ImageNotFound):
            raise RuntimeConflict(f"sandbox {sid} cannot boot: {exc.message}") from exc
        if isinstance(exc, (SandboxRuntimeError, OSError)):
            why = exc.message if isinstance(exc, SandboxRuntimeError) else str(exc)
            raise RuntimeBusy(f"sandbox {sid} did not boot: {why}") from exc
        raise


def park(rt: LocalRuntime, record: SandboxRecord, reason: str | None) -> SandboxRecord:
    """End every process of the sandbox and keep its files: paused, filesystem only
    (``reason``: why, when nobody asked). Its disk, id range and network slot stay; its
    groups, its rules and its processes' memory go. Caller holds the id's lock.

    Processes first, the record last: a crash in between leaves a sandbox whose init
    is dead and whose disk is there, which reads as parked just the same."""
    sid, d = record.sandbox_id, rt.layout.sandbox_dir(record.sandbox_id)
    rt.end_processes(sid)
    for claim in d.glob(f"{CLAIM_PREFIX}*.sock"):
        rt.spares.discard_group(Spares.group_of(claim))
    slot = rt.layout.slot_of(sid)
    if rt.network is not None and slot is not None:
        rt.network.release(slot)
    disks.sync(d)  # what it wrote survives a power cut from here on
    for volume_id in {m.volume_id for m in record.volume_mounts}:
        with contextlib.suppress(OSError):  # shared: others may write on; best effort
            rt.volumes.sync(volume_id)
    parked = record.replace(init_pid=0, init_start=0, parked=Parked(reason, time.time()))
    parked.save(d)
    return parked


def end_processes(rt: LocalRuntime, name: str) -> None:
    """Kill every process in the groups ``name`` and remove them."""
    if rt.cgroups.exists(name):
        rt.cgroups.kill_all(name)
        if not rt.cgroups.wait_empty(name):
            raise RuntimeUnavailable(f"sandbox {name}: processes survived SIGKILL")
        rt.cgroups.remove(name)


def destroy(rt: LocalRuntime, sandbox_id: str) -> bool:
    """Kill every process of the sandbox and remove its groups and files. Caller holds
    the id's lock. Returns whether anything existed."""
    d = rt.layout.sandbox_dir(sandbox_id)
    existed = d.exists() or rt.cgroups.exists(sandbox_id)
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
        rt.end_processes(name)
    # No process of the sandbox is left: its rules, then its id range (and with it its
    # network slot), may go to the next one. Its link went with its network namespace.
    for name in names:
        if rt.network is not None:
            slot = rt.layout.slot_of(name)
            if slot is not None:
                rt.network.release(slot)
        rt.layout.id_base_free(name)
    if d.exists():
        # A claimed launcher that never became the sandbox's (a crash between the
        # claim and the groups' rename) still sits in its spare groups.
        for claim in d.glob(f"{CLAIM_PREFIX}*.sock"):
            rt.spares.discard_group(Spares.group_of(claim))
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
