"""sandboxd's ``cgroupdir=`` item: the sandbox is born in a cgroup v2 group (clone3 with
CLONE_INTO_CGROUP) instead of its launcher migrating into it. The runtime sends it on
cgroup v2 hosts (``Cgroups.clone_into``); these machines are cgroup v1 with a unified (v2)
hierarchy beside it that holds no controllers, so the test asks for both: the v1 joins the
runtime always makes here, and birth in a group of that unified hierarchy, which is where
the sandbox's processes must then be found."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2bfacade.runtime.base import CreateRefused, SandboxSpec
from e2bfacade.runtime.local import LocalRuntime
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.runtime.helpers import ok

UNIFIED = Path("/sys/fs/cgroup/unified")


def v2_group_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"process {pid} is in no cgroup v2 group")


@pytest.fixture
def group() -> Iterator[Path]:
    if not (UNIFIED / "cgroup.procs").exists():
        pytest.skip("no cgroup v2 hierarchy is mounted at /sys/fs/cgroup/unified")
    made = UNIFIED / f"e2bfacade-clone-{uuid.uuid4().hex[:8]}"
    made.mkdir()
    yield made
    made.rmdir()  # fails the test if a process of the sandbox was left in it


@pytest.fixture
def rt() -> Iterator[LocalRuntime]:
    runtime = make_runtime("e2bc2-", spares=0)  # every create through the daemon's handler
    runtime.ensure_base_image()
    yield runtime
    destroy_runtime(runtime)


def born_in(rt: LocalRuntime, monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Make every create of ``rt`` also ask sandboxd for birth in ``directory``."""
    launch = rt.sandboxer.launcher.launch

    def with_cgroupdir(request: list[str]) -> Any:
        return launch([*request, f"cgroupdir={directory}"])

    monkeypatch.setattr(rt.sandboxer.launcher, "launch", with_cgroupdir)


def test_a_sandbox_is_born_in_its_v2_group(
    rt: LocalRuntime, group: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    born_in(rt, monkeypatch, group)
    sid = f"c{uuid.uuid4().hex[:10]}"
    info = rt.create(SandboxSpec(sid, "base", memory_mb=256))
    expected = "/" + group.name
    assert v2_group_of(info.init_pid) == expected
    # Everything it starts is born there too, and the launcher that made it is gone.
    assert ok(rt, sid, "sleep 30 & echo started") == "started\n"
    members = [int(p) for p in (group / "cgroup.procs").read_text().split()]
    assert info.init_pid in members and len(members) >= 3  # init, agent, sleep
    assert all(v2_group_of(pid) == expected for pid in members)
    assert os.getpid() not in members
    rt.kill(sid)
    assert (group / "cgroup.procs").read_text().split() == []


def test_a_group_that_does_not_exist_refuses_the_create_and_leaves_nothing(
    rt: LocalRuntime, group: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    born_in(rt, monkeypatch, group / "missing")
    sid = f"c{uuid.uuid4().hex[:10]}"
    with pytest.raises(CreateRefused) as caught:
        rt.create(SandboxSpec(sid, "base", memory_mb=256))
    assert "cgroup" in caught.value.message
    assert sid not in {s.sandbox_id for s in rt.list()}
    assert not (rt.root / "sandboxes" / sid).exists()
