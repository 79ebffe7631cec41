"""Pruning the build pipeline's host caches, which nothing else ever shrinks: the pulled
images' flattened trees (``TEMPLATE_PULL_CACHE_DIR``, registry.py) and the Debian bases'
tarballs and OCI layouts (``TEMPLATE_CACHE_DIR/bases``, debian.py), and the system
templates' finished images (``TEMPLATE_IMAGE_CACHE_DIR``, image_cache.py).

An entry is what one key caches (a pulled tree's directory; a base's ``.tar`` or ``.oci``)
with the time it was last used (a cache hit touches it) and its size on disk. Pruning
removes every entry unused for the cache's keep-days, then, while the cache is over its
size, the least recently used — but never an entry used within the last ``GRACE_SECONDS``
(a build may be copying it into an image right now), never a current Debian recipe's, and
never one whose lock a puller, builder or restorer holds (taken without waiting, held
while it goes). A runtime image made from an entry does not need it: the entry only saves
the next pull.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

GRACE_SECONDS = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class Entry:
    path: Path  # a directory or a file
    lock: Path  # the lock file its puller or builder holds while it writes it
    used: float  # when it was last used (its mtime; a cache hit touches it)
    size: int  # bytes on disk


def touch(path: Path) -> None:
    """Mark a cache entry used now (what pruning orders by)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def disk_bytes(path: Path) -> int:
    """The bytes ``path`` (a file, or a tree never followed through a link) takes on disk."""
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_blocks * 512
        total = 0
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
        return total
    except OSError:
        return 0


def pulled_entries(cache_dir: Path) -> list[Entry]:
    """The pulled trees of registry.py's cache: a directory per key, its lock beside it."""
    if not cache_dir.is_dir():
        return []
    out = []
    for path in cache_dir.iterdir():
        if path.name.startswith(".") or not path.is_dir():
            continue
        meta = path / "image.json"
        used = meta.stat().st_mtime if meta.exists() else path.stat().st_mtime
        out.append(Entry(path, cache_dir / f".{path.name}.lock", used, disk_bytes(path)))
    return out


def bases_entries(cache_dir: Path, keep: Iterable[str]) -> list[Entry]:
    """The Debian bases' tarballs and layouts (``<digest>.tar``, ``<digest>.oci``), less
    those of the digests in ``keep`` (the current recipes'); debian.py locks per digest."""
    if not cache_dir.is_dir():
        return []
    kept = set(keep)
    out = []
    for path in cache_dir.iterdir():
        digest, dot, suffix = path.name.partition(".")
        if path.name.startswith(".") or not dot or suffix not in ("tar", "oci") or digest in kept:
            continue
        lock = cache_dir / f".{digest}.lock"
        out.append(Entry(path, lock, path.stat().st_mtime, disk_bytes(path)))
    return out


def image_entries(cache_dir: Path) -> list[Entry]:
    """The finished images of image_cache.py: a directory per key, its lock beside it, last
    used when its manifest was (a restore touches it)."""
    if not cache_dir.is_dir():
        return []
    out = []
    for path in cache_dir.iterdir():
        if path.name.startswith(".") or not path.is_dir():
            continue
        meta = path / "manifest.json"
        used = meta.stat().st_mtime if meta.exists() else path.stat().st_mtime
        out.append(Entry(path, cache_dir / f".{path.name}.lock", used, disk_bytes(path)))
    return out


def prune(
    entries: Iterable[Entry], *, keep_seconds: float, max_bytes: int, now: float | None = None
) -> list[Path]:
    """Remove the entries unused for ``keep_seconds``, then the least recently used while
    their total is over ``max_bytes`` (none used within GRACE_SECONDS); returns what went."""
    now = time.time() if now is None else now
    ordered = sorted(entries, key=lambda e: e.used)
    total = sum(e.size for e in ordered)
    removed = []
    for entry in ordered:
        stale = now - entry.used > keep_seconds
        over = total > max_bytes and now - entry.used > GRACE_SECONDS
        if not (stale or over):
            continue
        if _remove(entry):
            removed.append(entry.path)
            total -= entry.size
    return removed


def _remove(entry: Entry) -> bool:
    """Remove ``entry`` under its lock, taken without waiting (held: in use, kept)."""
    try:
        lock = open(entry.lock, "a")  # noqa: SIM115 - closed below, after the removal
    except OSError:
        return False
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if entry.path.is_dir() and not entry.path.is_symlink():
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            entry.path.unlink(missing_ok=True)
        return not entry.path.exists()
    finally:
        lock.close()


def prune_all() -> list[Path]:
    """Prune the three caches by their settings (the worker's image sweep calls it)."""
    from templates.builds import image_cache
    from templates.builds.debian import RECIPES

    pulled = prune(
        pulled_entries(settings.TEMPLATE_PULL_CACHE_DIR),
        keep_seconds=settings.TEMPLATE_PULL_CACHE_KEEP_DAYS * DAY,
        max_bytes=settings.TEMPLATE_PULL_CACHE_MAX_MB << 20,
    )
    bases = prune(
        bases_entries(settings.TEMPLATE_CACHE_DIR / "bases", [r.digest() for r in RECIPES]),
        keep_seconds=settings.TEMPLATE_BASES_CACHE_KEEP_DAYS * DAY,
        max_bytes=settings.TEMPLATE_BASES_CACHE_MAX_MB << 20,
    )
    return pulled + bases + image_cache.prune()
