"""The sweep: what no live sandbox owns goes (groups without a sandbox, pool sandboxes whose
init died, directories a crashed creator left half-made, tombs a crash left); a sandbox
whose init died under it is parked (its files are kept, what its processes held goes).
Safe beside running creates: an id whose lock is held is skipped. It takes the host's parts
and the host's own park and destroy (what a sweep does to a sandbox is what they do)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection
from pathlib import Path

from e2bfacade.runtime.base import CRASH_REASON, SandboxRuntimeError
from e2bfacade.runtime.local.launcher import launch
from e2bfacade.runtime.local.parts import HostParts
from e2bfacade.runtime.local.pools.spares import CLAIM_PREFIX, Spares
from e2bfacade.runtime.local.record import SandboxRecord
from e2bfacade.runtime.local.state import proc_starttime
from e2bfacade.runtime.local.storage import disks


def sweep(
    parts: HostParts,
    seen_live: Collection[str],
    *,
    park: Callable[[SandboxRecord, str | None], object],
    destroy: Callable[[str], bool],
) -> list[str]:
    """Returns the ids released. ``seen_live``: ids the caller has just seen live, which
    need not be looked at again (if one died since, the next sweep has it)."""
    reaped = []
    groups = parts.cgroups.names()  # one listing, for the sandboxes' groups and the spares'
    for sid in sorted(
        (parts.layout.sandbox_ids() | parts.cgroups.list_ids(groups)) - set(seen_live)
    ):
        # Looked at without its lock first: a live sandbox stays live (a dead one never
        # comes back), so only what looks dead or half-made pays for the lock, and is
        # looked at again under it.
        if verdict(parts, sid) == "keep":
            continue
        with parts.layout.locked("sandbox", sid, blocking=False) as got:
            now = verdict(parts, sid) if got else "keep"
            record = parts.layout.read_state(sid)
            if now == "park" and record is not None:
                with contextlib.suppress(SandboxRuntimeError, OSError):
                    park(record, CRASH_REASON)
            elif now == "reap" and destroy(sid):
                reaped.append(sid)
    for p in (parts.root / "sandboxes").iterdir():
        if p.name.endswith(".deleting"):
            launch.bury(p)  # a crash (or an exit) came before the background removal did
    parts.spares.sweep(lambda: claimed_spares(parts.root), groups)
    if parts.network is not None:
        parts.network.sweep()
    parts.disk_pool.sweep()
    parts.refill.after_create()
    return reaped


def verdict(parts: HostParts, sandbox_id: str) -> str:
    """``keep`` a created sandbox whose init lives or that is parked; ``park`` one whose init
    died under it; ``reap`` the rest — half-made, a pool sandbox whose init died or that
    older helper binaries made (which no create takes), one whose disk is gone."""
    record = parts.layout.read_state_cached(sandbox_id)
    if record is None or (record.warm_version or parts.version) != parts.version:
        return "reap"
    if record.parked is not None or proc_starttime(record.init_pid) == record.init_start:
        return "keep"
    if record.is_warm or not disks.exists(parts.layout.sandbox_dir(sandbox_id)):
        return "reap"
    return "park"


def claimed_spares(root: Path) -> set[str]:
    """The spare groups whose launchers creates have claimed (a socket in their directory)."""
    claimed = set()
    for entry in os.scandir(root / "sandboxes"):
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
