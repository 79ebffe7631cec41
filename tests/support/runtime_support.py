"""The real local runtime for Django-level tests (tests/api, tests/idempotency, tests/ops):
a session's sandbox root, the per-test runtime fixture's body, and a thorough cleanup."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2bfacade import sandbox_runtime
from e2bfacade.runtime.base import ImageInUse, RuntimeUnavailable
from e2bfacade.runtime.local import BASE_IMAGE, HostRuntime, LocalRuntime, lxcfs
from e2bfacade.sandbox_runtime import get_runtime
from templates.models import Template


def helper_pids(root: Path) -> list[int]:
    """Every sandboxd process serving ``root`` (the listener and its keeper, whatever they
    call themselves): any process whose command line names a socket under it — and, for
    the gvisor driver, every process of runsc's with the root's state (a sandbox's
    processes, the keeper that reaps them)."""
    prefix = str(root / "run" / "sandboxd-").encode()
    runsc_state = f"--root={root / 'runsc'}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(prefix in arg or arg == runsc_state for arg in argv):
            pids.append(int(entry))
    return pids


def power_cut(root: Path, *, one_by_one: bool = False) -> None:
    """What a power cut leaves of the runtime root ``root``: every process of it gone at
    once — the launcher daemon and its keeper, spare launchers, every sandbox's init and
    agent (all in the root's cgroups) — and, as after a reboot, none of its disks mounted.
    (The service's own processes, gunicorn and the rest, are the caller's to kill.)

    ``one_by_one``: SIGKILL each process as an operator's ``kill -9`` does, with no thaw:
    a frozen sandbox's processes then die only when they next run (a thaw), so the service
    starts again beside inits that look alive and frozen but are doomed."""
    from e2bfacade.runtime.local.cgroups import detect
    from e2bfacade.runtime.local.net.network import digest_of

    for pid in helper_pids(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    cgroups = detect(f"e2bfacade-{digest_of(root)}", "auto")
    for name in cgroups.names():
        if not one_by_one:
            cgroups.kill_all(name)
            continue
        for pid in cgroups.pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for name in cgroups.names():
        if not one_by_one or not cgroups.is_frozen(name):
            cgroups.wait_empty(name)
    for pid in helper_pids(root):
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.waitpid(pid, 0)  # ours, when this process's runtime started it
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(f"{root}/")
    ]
    for mount_point in sorted(mounts, reverse=True):
        subprocess.run(["umount", "-l", mount_point], check=True)


def kill_everything(rt: LocalRuntime) -> None:
    """Kill every sandbox of ``rt`` and delete every image but base (children first)."""
    ids = {p.name for p in (rt.root / "sandboxes").iterdir() if not p.name.startswith(".")}
    for sandbox_id in ids | rt.cgroups.list_ids():
        rt.kill(sandbox_id)
    rt.sweep()
    images = [i for i in rt.list_images() if i != BASE_IMAGE]
    while images:
        left = []
        for image_id in images:
            try:
                rt.delete_image(image_id)
            except ImageInUse:
                left.append(image_id)
        if len(left) == len(images):
            raise AssertionError(f"images still in use after every sandbox was killed: {left}")
        images = left


def session_sandbox_root(prefix: str) -> Iterator[Path]:
    """A fresh SANDBOX_ROOT under /tmp (short: it holds a unix socket) for a test session;
    afterwards its sandboxes, its sandboxd, its cgroup parents and its files are gone."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    yield root
    # The runtime the tests used (get_runtime's, cached in this process) may still be
    # refilling in the background: one pool size after another, each under the pool's lock,
    # so a discard by another runtime object could land between two sizes and the next one
    # be made after it. Stop that one first: its discard waits for its own refill to end.
    for cached in list(sandbox_runtime._runtimes.values()):
        inner = getattr(cached, "_inner", cached)  # under FaultyRuntime when failpoints are on
        if isinstance(inner, HostRuntime) and inner.root == root:  # either driver's
            inner.discard_spares()
    try:
        rt = LocalRuntime(root)
    except RuntimeUnavailable:
        shutil.rmtree(root, ignore_errors=True)
        return
    # First the spare launchers and pooled disks (the runtime the tests used refilled them
    # in the background; its filler holds the pool's lock, so this waits for it).
    rt.discard_spares()
    kill_everything(rt)
    for pid in helper_pids(root):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # our child (started by the runtime's ensure_daemon): reap it
        except (ProcessLookupError, ChildProcessError):
            pass
    lxcfs.stop(root)
    cg: Any = rt.cgroups
    for parent in list(cg.roots.values()) if cg.version == 1 else [cg.root]:
        try:
            parent.rmdir()
        except OSError:
            pass
    shutil.rmtree(root, ignore_errors=True)


def django_runtime(settings: Any, sandbox_root: Path) -> Iterator[LocalRuntime]:
    """The real local runtime every API call of the test uses; emptied when the test ends."""
    settings.SANDBOX_ROOT = sandbox_root
    try:
        rt = get_runtime()
    except RuntimeUnavailable as exc:
        pytest.skip(f"the local runtime cannot run here: {exc.message}")
    assert isinstance(rt, LocalRuntime)
    # The public base template comes from a data migration; a transactional test's flush
    # deletes it, so make sure it is there for every test.
    Template.objects.get_or_create(
        template_id="base", defaults={"alias": "base", "image_id": BASE_IMAGE, "team": None}
    )
    yield rt
    kill_everything(rt)
