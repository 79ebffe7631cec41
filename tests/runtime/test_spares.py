"""Spare launchers and pooled disks: what a create takes instead of doing the slow part
itself (a cgroup migration, mkfs and mount). Each is taken by exactly one create, a dead
one only costs speed, and whatever a crash leaves is swept."""

from __future__ import annotations

import ctypes
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import SandboxSpec
from e2bfacade.runtime.local import LocalRuntime
from e2bfacade.runtime.local.cgroups import SPARE_PREFIX
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.runtime.helpers import (
    cgroup_file,
    init_and_agent,
    kill_and_wait,
    loop_backings,
    ok,
)
from tests.support.waiting import eventually

DISK = 1024  # SandboxSpec's default disk size, the one the pool keeps first


@pytest.fixture(scope="module")
def rt() -> Iterator[LocalRuntime]:
    runtime = make_runtime("e2bs-", spares=2)
    runtime.ensure_base_image()
    yield runtime
    destroy_runtime(runtime)


def filled(rt: LocalRuntime) -> None:
    rt.replenish(DISK)
    eventually(
        lambda: (rt.spares.ready(), rt.disk_pool.ready(DISK)),
        until=lambda pools: all(len(ready) >= 2 for ready in pools),
        within=30,
        what="2 spares and 2 disks ready",
    )


def spare_pids(rt: LocalRuntime) -> list[int]:
    return [p for g in rt.cgroups.spare_groups() for p in rt.cgroups.pids(g)]


def new_id() -> str:
    return f"s{uuid.uuid4().hex[:12]}"


def test_a_create_takes_a_parked_launcher_and_a_pooled_disk(rt: LocalRuntime) -> None:
    filled(rt)
    pooled = {os.stat(p).st_ino for p in rt.disk_pool.ready(DISK)}
    sid = new_id()
    info = rt.create(SandboxSpec(sid, "base", memory_mb=300))
    d = rt.root / "sandboxes" / sid
    assert list(d.glob("launcher-*.sock")), "the create did not use a spare launcher"
    assert os.stat(d / "disk.img").st_ino in pooled, "the create did not use a pooled disk"
    # The spare's groups became the sandbox's, with its limits, and hold only its init.
    assert init_and_agent(rt.cgroups.pids(sid), info.init_pid)
    limit = cgroup_file(rt, sid, "memory", "memory.limit_in_bytes").read_text()
    assert int(limit) == 300 << 20
    # The pooled disk is mounted as a fresh one would be: nodev, nosuid.
    mount = next(
        line
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if f" {d / 'disk'} " in line
    )
    assert {"nodev", "nosuid"} <= set(mount.split()[5].split(",")), mount
    assert ok(rt, sid, "echo hi > /home/user/f && cat /home/user/f", user="user") == "hi\n"
    assert rt.kill(sid)
    filled(rt)  # and the pools refill themselves


def test_concurrent_creates_never_share_a_spare(rt: LocalRuntime) -> None:
    filled(rt)
    ids = [new_id() for _ in range(6)]
    errors: list[BaseException] = []

    def create(sid: str) -> None:
        try:
            rt.create(SandboxSpec(sid, "base", memory_mb=128))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(sid,)) for sid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    claims = [c.name for sid in ids for c in (rt.root / "sandboxes" / sid).glob("launcher-*")]
    assert len(claims) == len(set(claims)) >= 1
    for sid in ids:
        assert len(rt.cgroups.pids(sid)) == 2, (sid, rt.cgroups.pids(sid))  # init + agent
        assert ok(rt, sid, "cat /proc/1/comm").strip() == "e2b-init"
        rt.kill(sid)


def test_dead_spares_cost_only_speed_and_are_swept(rt: LocalRuntime) -> None:
    filled(rt)
    kill_and_wait(spare_pids(rt))
    assert not spare_pids(rt)
    sid = new_id()
    info = rt.create(SandboxSpec(sid, "base"))
    assert init_and_agent(rt.cgroups.pids(sid), info.init_pid)
    assert ok(rt, sid, "echo alive").strip() == "alive"
    rt.sweep()
    eventually(  # refilled with live ones
        lambda: spare_pids(rt), until=lambda p: len(p) >= 2, within=30, what="live spares"
    )
    for group in rt.cgroups.spare_groups():
        assert rt.cgroups.pids(group), f"dead spare group {group} left behind"
    rt.kill(sid)


def test_a_claim_a_crash_left_behind_is_cleared_with_its_sandbox(rt: LocalRuntime) -> None:
    filled(rt)
    sid = new_id()
    d = rt.root / "sandboxes" / sid
    d.mkdir(mode=0o700)
    claimed = rt.spares.claim(d)  # as a create that crashed right after its claim
    assert claimed is not None
    group = SPARE_PREFIX + claimed.stem.removeprefix("launcher-")
    assert rt.cgroups.pids(group)
    assert sid in rt.sweep()
    assert not rt.cgroups.exists(group) and not d.exists()


def test_pooled_disks_whose_mounts_are_gone_are_discarded(rt: LocalRuntime) -> None:
    # After a reboot the pool's images are on disk but their mounts are not.
    filled(rt)
    libc = ctypes.CDLL(None, use_errno=True)
    for image in rt.disk_pool.ready(DISK):
        assert libc.umount2(os.fsencode(image.with_suffix("")), 2) == 0
    sid = new_id()
    rt.create(SandboxSpec(sid, "base"))
    assert ok(rt, sid, "df -k / | tail -1").split()[1] != "0"
    rt.sweep()
    filled(rt)
    for image in rt.disk_pool.ready(DISK):
        assert os.path.ismount(image.with_suffix(""))
    rt.kill(sid)


def test_without_spares_nothing_is_made_ahead() -> None:
    runtime = make_runtime("e2bn-", spares=0)
    try:
        sid = new_id()
        runtime.create(SandboxSpec(sid, "base"))
        runtime.sweep()
        assert not runtime.cgroups.spare_groups() and not runtime.spares.ready()
        assert not list(runtime.disk_pool.dir.iterdir())
        assert not list((runtime.root / "sandboxes" / sid).glob("launcher-*"))
    finally:
        destroy_runtime(runtime)


def test_spares_of_another_helper_version_are_never_claimed_and_are_swept(rt: LocalRuntime) -> None:
    from e2bfacade.runtime.local.pools.spares import Spares

    rt.spares.fill()
    parked = rt.cgroups.spare_groups()
    assert parked
    upgraded = Spares(rt.layout, rt.cgroups, lambda: rt.root, target=2, version="newer")
    assert upgraded.ready() == []
    assert upgraded.claim(rt.root / "sandboxes") is None
    upgraded.sweep(set)
    assert not set(parked) & set(rt.cgroups.spare_groups())


def test_discarding_spares_leaves_no_process_group_mount_or_device(rt: LocalRuntime) -> None:
    filled(rt)
    pool = str(rt.disk_pool.dir)
    rt.discard_spares()
    assert not rt.cgroups.spare_groups() and not spare_pids(rt)
    assert pool not in Path("/proc/self/mountinfo").read_text()
    backings = loop_backings()
    assert not [b for b in backings if b.startswith(pool)], backings
