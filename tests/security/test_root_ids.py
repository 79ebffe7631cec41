"""Two runtime roots (two services) on one host never run sandboxes as the same host uid:
each root holds a block of host ids of its own in the host's registry (roots.py), a root
whose sandboxes are owned by a block another root holds refuses to start naming it, and a
root made before roots had blocks keeps the ids its sandboxes already run as. The blocks
are few (15 in the 32-bit id space); past them a root is refused, naming the holders."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import BUILTIN_IMAGE, RuntimeUnavailable, SandboxSpec, SandboxState
from e2bfacade.runtime.gvisor.driver import GvisorRuntime
from e2bfacade.runtime.local import HostRuntime, LocalRuntime
from e2bfacade.runtime.local.ids import (
    BLOCK_LOCK,
    ID_BLOCK,
    ID_BLOCKS,
    ID_FIRST_BASE,
    recorded_block,
)
from e2bfacade.runtime.local.net import roots
from tests.runtime.conftest import destroy_runtime, make_gvisor_runtime, make_runtime

# The two drivers' roots: how the tests make one, and the class that opens one. What the
# sandboxes of a root run as crosses the sandboxer seam (both drivers); a root's block of
# host ids is the host layer both share (the local driver's root only).
DRIVERS = pytest.mark.parametrize(
    ("make", "driver"),
    [(make_runtime, LocalRuntime), (make_gvisor_runtime, GvisorRuntime)],
    ids=["local", "gvisor"],
)
HOST_LAYER = pytest.mark.parametrize(
    ("make", "driver"), [(make_runtime, LocalRuntime)], ids=["local"]
)


@pytest.fixture
def runtimes() -> Iterator[list[HostRuntime]]:
    made: list[HostRuntime] = []
    yield made
    for rt in made:
        destroy_runtime(rt)


def _host_ids(pid: int) -> tuple[set[int], range]:
    """The host uids and gids process ``pid`` runs as, and the host ids its user namespace
    maps (read from procfs, not from the runtime)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    ids = {
        int(value)
        for line in status
        if line.startswith(("Uid:", "Gid:"))
        for value in line.split()[1:]
    }
    _, outside, count = map(int, Path(f"/proc/{pid}/uid_map").read_text().split())
    assert Path(f"/proc/{pid}/gid_map").read_text().split() == ["0", str(outside), str(count)]
    return ids, range(outside, outside + count)


@pytest.mark.sandboxer
@DRIVERS
def test_the_sandboxes_of_two_roots_never_run_as_the_same_host_uid(
    runtimes: list[HostRuntime], make: Callable[..., LocalRuntime], driver: type[HostRuntime]
) -> None:
    if driver is GvisorRuntime:
        pytest.skip(
            "gvisor: no guest id is a host id (the guest's tasks are gVisor's, its files keep "
            "guest ids); what runs every gvisor sandbox of every root is the sentry, as host "
            "uid 0 (test_identities.py's xfail)"
        )
    for _ in range(2):
        runtimes.append(make(spares=0))
    # The same sandbox id in both (two services may well hand out the same one): within
    # one root it would take the same id range.
    sid = f"u{os.urandom(6).hex()}"
    seen = []
    for rt in runtimes:
        info = rt.create(SandboxSpec(sid, BUILTIN_IMAGE))
        seen.append(_host_ids(info.init_pid))
    (ids_a, map_a), (ids_b, map_b) = seen
    assert not ids_a & ids_b, (ids_a, ids_b)
    assert not set(map_a) & set(map_b), (map_a, map_b)
    assert ids_a <= set(map_a) and ids_b <= set(map_b)
    # Each root's sandboxes run inside its own block, and the blocks are disjoint.
    a, b = (rt.layout.id_block for rt in runtimes)
    assert a != b
    for rt, mapped in zip(runtimes, (map_a, map_b), strict=True):
        first = rt.layout.id_block_base
        assert first <= mapped.start and mapped.stop <= first + ID_BLOCK
        assert recorded_block(rt.root) == rt.layout.id_block  # kept in the root itself
        claim = roots.find_ids(rt.root)
        assert claim is not None and claim.block == rt.layout.id_block


@HOST_LAYER
def test_a_root_whose_block_another_root_holds_refuses_to_start_naming_it(
    runtimes: list[HostRuntime], make: Callable[..., LocalRuntime], driver: type[HostRuntime]
) -> None:
    holder = make(spares=0)
    runtimes.append(holder)
    sid = f"u{os.urandom(6).hex()}"
    holder.create(SandboxSpec(sid, BUILTIN_IMAGE))
    # A copy of that root (a backup restored beside it) records the same block and holds
    # a sandbox owned by it.
    copy = Path(tempfile.mkdtemp(prefix="e2bt-", dir="/tmp"))
    try:
        shutil.copytree(holder.root / "ids", copy / "ids", symlinks=True)
        with pytest.raises(RuntimeUnavailable) as refused:
            runtimes.append(driver(copy, spares=0))
        assert str(holder.root) in refused.value.message, refused.value.message
        assert "host ids" in refused.value.message
        assert roots.find_ids(copy) is None  # it claimed nothing
        assert recorded_block(copy) == holder.layout.id_block  # and changed nothing
        assert holder.status(sid).state is SandboxState.RUNNING
        # It can still be opened to be torn down (teardown_root), taking no ids.
        opened = driver(copy, spares=0, claim_ids=False)
        runtimes.append(opened)
        with pytest.raises(RuntimeUnavailable):
            opened.layout.id_base_take(f"u{os.urandom(6).hex()}")
        assert roots.find_ids(copy) is None
    finally:
        if all(rt.root != copy for rt in runtimes):  # else the fixture removes it
            shutil.rmtree(copy, ignore_errors=True)


# The registry's decisions, on a registry of the test's own (real files and locks; the
# roots are directories as the runtime lays them out, with what their sandboxes leave).
def _root(parent: Path, name: str) -> Path:
    root = parent / name
    for sub in ("ids", "sandboxes", "locks"):
        (root / sub).mkdir(parents=True)
    return root


def _start_sandbox(root: Path) -> None:
    (root / "ids" / "17").write_text(f"s{root.name}")  # its id range, held


def _claim(root: Path, registry: Path) -> roots.IdClaim:
    with roots.locked(registry):
        return roots.claim_ids(root, registry=registry)


def _started(parent: Path, name: str, registry: Path) -> tuple[Path, int]:
    """A root that claimed its block and then started a sandbox."""
    root = _root(parent, name)
    block = _claim(root, registry).block
    _start_sandbox(root)
    return root, block


def test_a_root_made_before_roots_had_blocks_keeps_the_host_ids_its_sandboxes_run_as(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "registry" / "ids"
    old = _root(tmp_path, "old")
    _start_sandbox(old)  # with no record: made by a runtime that had no blocks
    claim = _claim(old, registry)
    assert claim.block == 0 and claim.first_id == ID_FIRST_BASE  # 2^20 + slot * 65536
    assert recorded_block(old) == 0
    # A second such root cannot have them too: it is refused, naming the first.
    other = _root(tmp_path, "other-old")
    _start_sandbox(other)
    with pytest.raises(roots.RootConflict) as refused:
        _claim(other, registry)
    assert str(old) in str(refused.value) and "teardown_root" in str(refused.value)
    assert recorded_block(other) is None
    # A new root (nothing of it owned by any block yet) takes a free one.
    assert _claim(_root(tmp_path, "new"), registry).block == 1


def test_past_the_fifteenth_root_a_root_is_refused_naming_the_holders(tmp_path: Path) -> None:
    registry = tmp_path / "registry" / "ids"
    started = [_started(tmp_path, f"r{n}", registry) for n in range(ID_BLOCKS)]
    assert sorted(block for _, block in started) == list(range(ID_BLOCKS)) and ID_BLOCKS == 15
    held = [root for root, _ in started]
    late = _root(tmp_path, "late")
    with pytest.raises(roots.RootConflict) as refused:
        _claim(late, registry)
    assert "all 15 blocks" in str(refused.value)
    assert all(str(root) in str(refused.value) for root in held)
    # A root deleted gives its block up.
    gone = recorded_block(held[3])
    shutil.rmtree(held[3])
    assert _claim(late, registry).block == gone


def test_an_empty_root_keeps_its_block_while_its_service_runs_and_no_longer(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "registry" / "ids"
    full = [_started(tmp_path, f"r{n}", registry)[0] for n in range(ID_BLOCKS - 1)]
    idle = _root(tmp_path, "idle")  # no sandboxes, but its service runs (holds the lock)
    service = os.open(idle / BLOCK_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(service, fcntl.LOCK_SH)
        block = _claim(idle, registry).block
        late = _root(tmp_path, "late")
        with pytest.raises(roots.RootConflict):
            _claim(late, registry)
    finally:
        os.close(service)
    # Its service ended and nothing of it is owned by the block: the next root takes it.
    assert _claim(late, registry).block == block
    _start_sandbox(late)
    # Started again, the idle root moves to a free block (its record follows) or, with
    # none free, is refused; it never shares one.
    with pytest.raises(roots.RootConflict):
        _claim(idle, registry)
    shutil.rmtree(full[0])
    moved = _claim(idle, registry).block
    assert moved != block and recorded_block(idle) == moved
