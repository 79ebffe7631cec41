"""One lxcfs per runtime root, whoever asks for it at once, and none left after a stop."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from e2bfacade.runtime.local import lxcfs


def serving(mount: Path) -> list[int]:
    target = str(mount).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"lxcfs") and target in argv:
            pids.append(int(entry.name))
    return pids


def mounted(mount: Path) -> int:
    return sum(line.split()[4] == str(mount) for line in open("/proc/self/mountinfo"))


@pytest.mark.skipif(shutil.which("lxcfs") is None, reason="lxcfs is not installed")
def test_concurrent_launches_start_one_lxcfs_and_a_stop_leaves_none() -> None:
    root = Path(tempfile.mkdtemp(prefix="e2bx-", dir="/tmp"))
    try:
        got: list[Path | None] = []
        threads = [
            threading.Thread(target=lambda: got.append(lxcfs.ensure(root))) for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert got == [root / "lxcfs"] * 6
        assert len(serving(root / "lxcfs")) == 1 and mounted(root / "lxcfs") == 1
        lxcfs.stop(root)
        assert mounted(root / "lxcfs") == 0
    finally:
        lxcfs.stop(root)
        shutil.rmtree(root, ignore_errors=True)
