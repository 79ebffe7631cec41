"""One lxcfs per runtime root, whoever asks for it at once, and none left after a stop."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from e2bfacade.runtime.local import lxcfs
from tests.support.waiting import eventually


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


@pytest.mark.skipif(shutil.which("lxcfs") is None, reason="lxcfs is not installed")
def test_a_caller_that_finds_lxcfs_starting_waits_for_it_and_never_restarts_it() -> None:
    """A starter that gave up waiting (a loaded host) leaves an lxcfs coming up; the next
    caller must wait for that one, not end it: ending it unmounts what a third caller may
    already have been handed, and that caller's launches fail on a missing file."""
    root = Path(tempfile.mkdtemp(prefix="e2bx-", dir="/tmp"))
    try:
        assert lxcfs.ensure(root, timeout=0) is None  # started, not waited for
        pid_file = root / "lxcfs.pid"
        eventually(  # lxcfs writes it as it starts (measured: < 5 ms)
            lambda: pid_file.is_file() and pid_file.read_text().strip(),
            within=5,
            every=0.001,
            what="lxcfs's pid file",
        )
        first = int(pid_file.read_text())
        mount = lxcfs.ensure(root)
        assert mount == root / "lxcfs"
        assert serving(mount) == [first], "the starting lxcfs was ended and another started"
        assert mounted(mount) == 1
        # Every file a launch binds is there when ensure answers.
        assert all((mount / name).is_file() for name in lxcfs.FILES)
    finally:
        lxcfs.stop(root)
        shutil.rmtree(root, ignore_errors=True)
