"""The build pipeline's host caches are pruned (templates/builds/caches.py): by age, then by
size with the least recently used first; never a recently used entry, a current Debian
recipe's, or one whose lock a puller holds. Real directories and files on disk."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from templates.builds import caches

DAY = 86400.0


def entry(cache: Path, name: str, size: int, age_days: float) -> Path:
    path = cache / name
    (path / "rootfs").mkdir(parents=True)
    (path / "rootfs" / "blob").write_bytes(os.urandom(size))
    meta = path / "image.json"
    meta.write_text("{}")
    when = time.time() - age_days * DAY
    os.utime(meta, (when, when))
    return path


def test_entries_unused_past_their_keep_go_and_recent_ones_stay(tmp_path: Path) -> None:
    old = entry(tmp_path, "old", 4096, age_days=20)
    fresh = entry(tmp_path, "fresh", 4096, age_days=1)
    removed = caches.prune(
        caches.pulled_entries(tmp_path), keep_seconds=14 * DAY, max_bytes=1 << 30
    )
    assert removed == [old]
    assert not old.exists() and fresh.exists()


def test_over_its_size_the_least_recently_used_go_first_but_never_one_used_this_hour(
    tmp_path: Path,
) -> None:
    oldest = entry(tmp_path, "a", 64 << 10, age_days=3)
    older = entry(tmp_path, "b", 64 << 10, age_days=2)
    recent = entry(tmp_path, "c", 64 << 10, age_days=0)  # in use a moment ago
    total = sum(e.size for e in caches.pulled_entries(tmp_path))
    removed = caches.prune(
        caches.pulled_entries(tmp_path), keep_seconds=14 * DAY, max_bytes=total // 2
    )
    assert removed == [oldest, older]
    assert recent.exists()
    # Even alone over the bound, the entry used within the hour stays.
    assert caches.prune(caches.pulled_entries(tmp_path), keep_seconds=14 * DAY, max_bytes=0) == []


def test_a_cache_hit_counts_as_a_use(tmp_path: Path) -> None:
    path = entry(tmp_path, "hit", 4096, age_days=20)
    caches.touch(path / "image.json")
    assert caches.prune(caches.pulled_entries(tmp_path), keep_seconds=14 * DAY, max_bytes=0) == []


def test_an_entry_whose_lock_is_held_is_kept(tmp_path: Path) -> None:
    path = entry(tmp_path, "busy", 4096, age_days=20)
    with open(tmp_path / ".busy.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert caches.prune(caches.pulled_entries(tmp_path), keep_seconds=0, max_bytes=0) == []
    assert path.exists()
    assert caches.prune(caches.pulled_entries(tmp_path), keep_seconds=0, max_bytes=0) == [path]


def test_a_current_debian_recipes_base_is_never_pruned(tmp_path: Path) -> None:
    when = time.time() - 400 * DAY
    for name in ("current.tar", "stale.tar"):
        (tmp_path / name).write_bytes(b"x" * 4096)
        os.utime(tmp_path / name, (when, when))
    (tmp_path / "stale.oci").mkdir()
    (tmp_path / "stale.oci" / "index.json").write_text("{}")
    os.utime(tmp_path / "stale.oci", (when, when))
    removed = caches.prune(
        caches.bases_entries(tmp_path, keep=["current"]), keep_seconds=30 * DAY, max_bytes=0
    )
    assert sorted(p.name for p in removed) == ["stale.oci", "stale.tar"]
    assert (tmp_path / "current.tar").exists()
