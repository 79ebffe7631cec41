"""The warm pool: sandboxes started ahead of time, so that a create takes one instead of
starting its own, and, for a template with a start command, one whose service is already
up instead of waiting for it. By default only templates with a start command have a pool
(``SANDBOX_WARM_POOL`` each); a template's ``warm_pool`` sets its own size, any template.

A pool sandbox is an ordinary sandbox named ``warm-<token>``, made for one *shape* (image,
CPUs, memory, processes, disk, default user): its ``state.json`` carries ``"warm": <shape
key>`` (so :meth:`LocalRuntime.list` never shows it, and no team sees it in a listing or a
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

import hashlib
import json
import os
import secrets
from pathlib import Path

from e2bfacade.runtime.base import SandboxSpec

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
