"""Create is idempotent by id under retries and races, and parallel creates are independent."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from e2bfacade.runtime.base import RuntimeConflict, SandboxInfo, SandboxSpec, SandboxState
from e2bfacade.runtime.local import LocalRuntime, LocalSandboxInfo
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.runtime.helpers import cgroup_pids, daemon_pids, init_and_agent, ok
from tests.support.waiting import eventually


def test_creating_the_same_id_twice_adopts_the_first_sandbox(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    first = runtime.create(SandboxSpec(sandbox_id, "base"))
    second = runtime.create(SandboxSpec(sandbox_id, "base"))
    assert (first.adopted, second.adopted) == (False, True)
    assert second.init_pid == first.init_pid
    assert init_and_agent(cgroup_pids(runtime, sandbox_id), first.init_pid)
    assert [s.sandbox_id for s in runtime.list()].count(sandbox_id) == 1


def test_creating_an_existing_id_from_another_image_conflicts(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    first = runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, "echo x > /opt/x")
    snap = f"other-{sandbox_id}"
    runtime.snapshot(sandbox_id, snap)
    with pytest.raises(RuntimeConflict):
        runtime.create(SandboxSpec(sandbox_id, snap))
    assert runtime.status(sandbox_id).init_pid == first.init_pid


def test_ten_concurrent_creates_of_one_id_make_one_sandbox(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    with ThreadPoolExecutor(10) as pool:
        results = list(
            pool.map(lambda _: runtime.create(SandboxSpec(sandbox_id, "base")), range(10))
        )
    assert sum(not r.adopted for r in results) == 1
    assert len({r.init_pid for r in results}) == 1
    assert runtime.cgroups.list_ids() >= {sandbox_id}
    assert init_and_agent(cgroup_pids(runtime, sandbox_id), results[0].init_pid)
    assert [s.sandbox_id for s in runtime.list()].count(sandbox_id) == 1


def test_twenty_parallel_creates_each_get_their_own_init(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    ids = [new_sandbox_id() for _ in range(20)]
    with ThreadPoolExecutor(20) as pool:
        results: list[LocalSandboxInfo] = list(
            pool.map(lambda sid: runtime.create(SandboxSpec(sid, "base", memory_mb=64)), ids)
        )
    assert [r.sandbox_id for r in results] == ids
    assert all(r.state is SandboxState.RUNNING and not r.adopted for r in results)
    assert len({r.init_pid for r in results}) == 20
    for r in results:
        assert init_and_agent(cgroup_pids(runtime, r.sandbox_id), r.init_pid)
    for sid in ids[:3]:  # each is a working, separate machine
        assert ok(runtime, sid, "hostname").strip() == sid


def test_the_first_creates_on_a_fresh_root_race_safely() -> None:
    # A freshly deployed service (new root, or new sandboxd source hash) gets its first
    # requests in parallel: building and starting the helper must not break under them.
    rt = make_runtime()
    try:
        rt.ensure_base_image()
        ids = [f"fresh{i}" for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(lambda sid: _try_create(rt, sid), ids))
        assert [o for o in outcomes if not isinstance(o, SandboxInfo)] == []
        # One listener. A launcher the daemon forks carries its command line for a moment
        # after it leaves the listener's tree (before it names itself), so a count taken
        # then sees two: the count is the one it settles to, within a bounded wait.
        eventually(
            lambda: daemon_pids(rt.root), until=lambda p: len(p) == 1, within=5, what="1 listener"
        )
    finally:
        destroy_runtime(rt)


def _try_create(rt: LocalRuntime, sid: str) -> SandboxInfo | str:
    try:
        return rt.create(SandboxSpec(sid, "base"))
    except Exception as exc:  # noqa: BLE001 - the test reports every failure at once
        return repr(exc)
