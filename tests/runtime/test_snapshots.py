"""Snapshots carry a sandbox's files, deletions and replaced directories included."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from e2bfacade.runtime.base import ImageInUse, SandboxRuntimeError, SandboxSpec
from e2bfacade.runtime.local import LocalRuntime
from tests.runtime.helpers import ok, sh


def image_id() -> str:
    return f"snap-{uuid.uuid4().hex[:10]}"


def test_a_snapshot_restores_files_deletions_and_opaque_dirs(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    a, b = new_sandbox_id(), new_sandbox_id()
    runtime.create(SandboxSpec(a, "base"))
    ok(
        runtime,
        a,
        "mkdir -p /opt/app/sub && echo one > /opt/app/sub/f && "
        "echo two > /home/user/notes && ln -s /opt/app/sub/f /opt/link && "
        "rm /etc/hostname && "
        "rm -rf /etc/ssl && mkdir /etc/ssl && touch /etc/ssl/only-this",
    )
    ok(runtime, a, "echo mine > /home/user/own", user="user")
    snap = image_id()
    info = runtime.snapshot(a, snap)
    assert info.parent == "base"
    assert runtime.status(a).state.value == "running"  # the snapshot thawed it again

    runtime.create(SandboxSpec(b, snap))
    assert ok(runtime, b, "cat /opt/app/sub/f /home/user/notes /opt/link") == "one\ntwo\none\n"
    assert sh(runtime, b, "test -e /etc/hostname").exit_code != 0
    assert ok(runtime, b, "ls -A /etc/ssl").split() == ["only-this"]
    assert ok(runtime, b, "stat -c %u /home/user/own").strip() == "1000"
    # What the snapshot did not touch is still the base image's.
    assert ok(runtime, b, "cat /etc/hosts").startswith("127.0.0.1")
    # And the host's view of the base template is unchanged.
    base = runtime.root / "images" / "base" / "rootfs"
    assert (base / "etc" / "hostname").exists() and (base / "etc" / "ssl" / "certs").exists()


def test_a_snapshot_of_a_restored_sandbox_chains(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    a, b, c, d = (new_sandbox_id() for _ in range(4))
    runtime.create(SandboxSpec(a, "base"))
    ok(
        runtime,
        a,
        "echo 1 > /opt/one && echo keep > /opt/keep && rm /etc/hostname && "
        "rm -rf /etc/ssl && mkdir /etc/ssl && touch /etc/ssl/only-this",
    )
    s1 = image_id()
    runtime.snapshot(a, s1)

    runtime.create(SandboxSpec(b, s1))
    ok(
        runtime,
        b,
        "echo 2 > /opt/two && rm /opt/one && echo changed > /opt/keep && "
        "touch /etc/ssl/second && echo back > /etc/hostname",
    )
    s2 = image_id()
    assert runtime.snapshot(b, s2).parent == s1

    runtime.create(SandboxSpec(c, s2))
    ok(runtime, c, "echo 3 > /opt/three && rm /etc/ssl/only-this && rm /etc/hostname")
    s3 = image_id()
    assert runtime.snapshot(c, s3).parent == s2

    runtime.create(SandboxSpec(d, s3))
    assert ok(runtime, d, "ls /opt").split() == ["keep", "three", "two"]
    assert ok(runtime, d, "cat /opt/keep /opt/two /opt/three") == "changed\n2\n3\n"
    assert ok(runtime, d, "ls -A /etc/ssl").split() == ["second"]
    assert sh(runtime, d, "test -e /etc/hostname").exit_code != 0
    assert [runtime.image_info(i).parent for i in (s3, s2, s1)] == [s2, s1, "base"]


def test_snapshot_is_idempotent_by_image_id(runtime: LocalRuntime, sandbox_id: str) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, "echo v1 > /opt/v")
    snap = image_id()
    first = runtime.snapshot(sandbox_id, snap)
    ok(runtime, sandbox_id, "echo v2 > /opt/v")
    assert runtime.snapshot(sandbox_id, snap) == first
    layer = runtime.root / "images" / snap / "rootfs" / "opt" / "v"
    assert layer.read_text() == "v1\n"


def test_a_restored_snapshot_cannot_chmod_host_files_through_a_tmp_symlink(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str], host_scratch: Path
) -> None:
    # Guest root owns its /tmp: it may replace it with a symlink to any host path. Starting
    # a sandbox from that snapshot must not follow the link on the host (before
    # pivot_root, "chmod tmp 1777" would make e.g. /etc/shadow world-writable).
    victim = host_scratch / "shadow-like"
    victim.write_text("secret\n")
    os.chmod(victim, 0o600)
    a, b = new_sandbox_id(), new_sandbox_id()
    runtime.create(SandboxSpec(a, "base"))
    ok(runtime, a, f"rm -rf /tmp && ln -s {victim} /tmp")
    snap = image_id()
    runtime.snapshot(a, snap)
    try:
        runtime.create(SandboxSpec(b, snap))
    except SandboxRuntimeError:
        pass  # refusing such a snapshot is fine
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600, oct(victim.stat().st_mode)


def test_a_snapshot_of_a_paused_sandbox_leaves_it_paused(
    runtime: LocalRuntime, sandbox_id: str
) -> None:
    runtime.create(SandboxSpec(sandbox_id, "base"))
    ok(runtime, sandbox_id, "echo kept > /opt/kept")
    runtime.pause(sandbox_id)
    snap = image_id()
    runtime.snapshot(sandbox_id, snap)
    assert runtime.status(sandbox_id).state.value == "paused"
    assert (runtime.root / "images" / snap / "rootfs" / "opt" / "kept").read_text() == "kept\n"


def test_an_image_in_use_cannot_be_deleted(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    a, b = new_sandbox_id(), new_sandbox_id()
    runtime.create(SandboxSpec(a, "base"))
    parent, child = image_id(), image_id()
    runtime.snapshot(a, parent)
    runtime.create(SandboxSpec(b, parent))
    runtime.snapshot(b, child)
    with pytest.raises(ImageInUse):
        runtime.delete_image("base")  # sandbox a, and every snapshot chain, stand on it
    with pytest.raises(ImageInUse):
        runtime.delete_image(parent)  # sandbox b and image child use it
    runtime.kill(b)
    with pytest.raises(ImageInUse):
        runtime.delete_image(parent)  # still the parent of child
    assert runtime.delete_image(child) is True
    assert runtime.delete_image(parent) is True
    assert runtime.delete_image(parent) is False
