"""Fixtures for the local runtime's tests: one real runtime per test session on a fresh,
short SANDBOX_ROOT under /tmp (a unix socket path must stay under 108 bytes), and unique
sandbox ids that are killed when the test ends. No database, no mocks."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from e2bfacade.runtime.base import RuntimeUnavailable
from e2bfacade.runtime.gvisor.driver import GvisorRuntime
from e2bfacade.runtime.local import HostRuntime, LocalRuntime, lxcfs
from e2bfacade.runtime.local.net import accounts
from e2bfacade.runtime.local.net.network import digest_of
from tests.runtime.helpers import any_daemon_pids, compile_static, sigkill_and_reap

PROBE_SOURCE = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
/* no argument: greet; one argument: open it read-only and report how many bytes it gave */
int main(int argc, char **argv) {
    if (argc < 2) { puts("hello from a static binary"); return 0; }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror("open"); return 1; }
    char buf[512];
    ssize_t n = read(fd, buf, sizeof buf);
    printf("read %zd\n", n);
    return n >= 0 ? 0 : 2;
}
"""


R = TypeVar("R", bound=HostRuntime)


def on_fresh_root(driver: type[R], prefix: str, **options: Any) -> R:
    """A runtime of ``driver`` (a driver on the host runtime) on a fresh root."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        return driver(root, **options)
    except RuntimeUnavailable as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"the {driver.name} runtime cannot run here: {exc.message}")


def make_runtime(prefix: str = "e2bt-", **options: Any) -> LocalRuntime:
    """A local runtime on a fresh root."""
    return on_fresh_root(LocalRuntime, prefix, **options)


def make_gvisor_runtime(prefix: str = "e2bg-", **options: Any) -> GvisorRuntime:
    """A gVisor runtime (the host runtime with gVisor's sandboxer) on a fresh root."""
    return on_fresh_root(GvisorRuntime, prefix, **options)


def destroy_runtime(rt: HostRuntime) -> None:
    """Kill every sandbox of ``rt``, end its daemons, remove its groups and the guard of its
    sandboxes' addresses (e2bfacade/runtime/local/net/accounts.py), and delete its root."""
    rt.discard_spares()
    sandboxes = rt.root / "sandboxes"
    ids = {p.name for p in sandboxes.iterdir() if not p.name.startswith(".")}
    for sid in ids | rt.cgroups.list_ids():
        try:
            rt.kill(sid)
        except Exception:  # noqa: BLE001 - best effort: report below what is left
            pass
    for pid in any_daemon_pids(rt.root):
        sigkill_and_reap(pid)
    lxcfs.stop(rt.root)
    if rt.cgroups.version == 1:
        parents = list(rt.cgroups.roots.values())  # type: ignore[attr-defined]
    else:
        parents = [rt.cgroups.root]  # type: ignore[attr-defined]
    for parent in parents:
        try:
            parent.rmdir()
        except OSError:
            pass
    accounts.remove(digest_of(rt.root))
    shutil.rmtree(rt.root, ignore_errors=True)


@pytest.fixture(scope="session")
def runtime() -> Iterator[LocalRuntime]:
    rt = make_runtime()
    rt.ensure_base_image()
    yield rt
    destroy_runtime(rt)


@pytest.fixture(scope="session")
def gvisor_runtime() -> Iterator[GvisorRuntime]:
    rt = make_gvisor_runtime()
    rt.ensure_base_image()
    yield rt
    destroy_runtime(rt)


@pytest.fixture
def new_sandbox_id(runtime: HostRuntime) -> Iterator[Callable[[], str]]:
    """A factory of unique sandbox ids; every id it handed out is killed at teardown."""
    made: list[str] = []

    def make() -> str:
        sid = f"t{uuid.uuid4().hex[:12]}"
        made.append(sid)
        return sid

    yield make
    for sid in made:
        runtime.kill(sid)


@pytest.fixture
def sandbox_id(new_sandbox_id: Callable[[], str]) -> str:
    return new_sandbox_id()


@pytest.fixture(scope="session")
def static_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny statically linked program: runs in a rootfs that has no libc."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the static probe")
    return compile_static(PROBE_SOURCE, tmp_path_factory.mktemp("probe") / "probe")


@pytest.fixture
def host_scratch() -> Iterator[Path]:
    """A directory on the host, outside any sandbox root, for escape canaries."""
    path = Path(tempfile.mkdtemp(prefix="e2bt-host-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
