"""The host ids a root's sandboxes run as: each sandbox's range within the root's block,
and the block's record in the root (the host's registry of blocks is net/roots.py, the
slots of one root are state.Layout's)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from e2bfacade.runtime.local.atomic import write_json

# Each live sandbox owns a range of host ids for its user namespace: guest id N is host id
# base + N. Ranges start above any account a host makes (subordinate ids conventionally
# start at 100000; we start at 2^20) and never overlap: 4096 ranges of 65536 ids.
ID_RANGE = 65536
ID_FIRST_BASE = 1 << 20
ID_SLOTS = 4096
# ... within the root's *block*: every runtime root of a host has its own 4096 ranges,
# disjoint from every other root's (two roots' sandboxes never run as one host uid), held
# in the host's registry (roots.py) and recorded in the root (ids/block.json) for its
# life. Block k starts at ID_FIRST_BASE + k * ID_BLOCK; block 0 is what every root used
# before roots had blocks. uid_t is 32 bits and (uid_t)-1 is no id: 15 blocks fit.
ID_BLOCK = ID_SLOTS * ID_RANGE
ID_BLOCKS = ((1 << 32) - 1 - ID_FIRST_BASE) // ID_BLOCK
BLOCK_RECORD = Path("ids", "block.json")
BLOCK_LOCK = Path("locks", "ids-block.lock")  # held shared by every process using the root


def block_base(block: int) -> int:
    """The host id of guest id 0 in slot 0 of the block ``block``."""
    return ID_FIRST_BASE + block * ID_BLOCK


def recorded_block(root: Path) -> int | None:
    """The block of host ids the root ``root`` records as its own; None when it records
    none (a new root, or one made before roots had blocks). Raises ValueError when the
    record is not a block's."""
    try:
        data = json.loads((root / BLOCK_RECORD).read_text())
    except FileNotFoundError:
        return None
    block = data.get("block") if isinstance(data, dict) else None
    if not isinstance(block, int) or not 0 <= block < ID_BLOCKS:
        raise ValueError(f"{root / BLOCK_RECORD} names no block of host ids: {data!r}")
    return block


def record_block(root: Path, block: int) -> None:
    first = block_base(block)
    write_json(root / BLOCK_RECORD, {"block": block, "first_id": first, "ids": ID_BLOCK})


def holds_sandboxes(root: Path) -> bool:
    """Whether anything of ``root`` runs as, or is owned by, its block's ids: a held slot
    (ids/<slot>: a sandbox, live or being made) or a sandbox's directory (its files)."""
    try:
        if any(name.isdigit() for name in os.listdir(root / "ids")):
            return True
        with os.scandir(root / "sandboxes") as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False


def block_in_use(root: Path) -> bool:
    """Whether a process has a ``state.Layout`` of ``root`` open (holds its block lock)."""
    try:
        fd = os.open(root / BLOCK_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the probe's lock
    return False
