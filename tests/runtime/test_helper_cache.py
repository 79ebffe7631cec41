"""The compiled C helper is shared by a host's roots through E2BFACADE_SANDBOXD_CACHE, and
only through a directory root alone can write (the helper runs as root)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from e2bfacade.runtime.local import build


def test_a_second_root_takes_the_helper_from_the_cache_without_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(build.CACHE_ENV, str(cache))
    first = build.ensure_binary(tmp_path / "a")
    assert (cache / first.name).read_bytes() == first.read_bytes()
    monkeypatch.setattr(shutil, "which", lambda _: None)  # no compiler from here on
    second = build.ensure_binary(tmp_path / "b")
    assert second.read_bytes() == first.read_bytes()
    assert os.access(second, os.X_OK)


@pytest.mark.parametrize("kind", ["group-writable", "a-symlink"])
def test_a_cache_others_could_write_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    if kind == "group-writable":
        cache.chmod(0o770)
        used = cache
    else:
        used = tmp_path / "link"
        used.symlink_to(cache)
    planted = cache / f"sandboxd-{build.source_hash()}"
    planted.write_bytes(b"#!/bin/sh\necho planted\n")
    monkeypatch.setenv(build.CACHE_ENV, str(used))
    binary = build.ensure_binary(tmp_path / "root")
    assert binary.read_bytes() != planted.read_bytes()  # compiled, not taken
