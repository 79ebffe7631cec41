"""Filesystem-only pause through the unmodified SDK (``pause(keep_memory=False)``, and a
timeout's ``on_timeout: {action: pause, mode: filesystem}``): the processes end, the files
stay, and ``connect`` cold-boots the same sandbox with the same access token."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxState

from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("envd_env")


def test_a_filesystem_pause_keeps_the_files_and_connect_cold_boots_the_same_sandbox(
    make_sandbox: Callable[..., Sandbox],
) -> None:
    sandbox = make_sandbox()
    sandbox.files.write("/home/user/marker.txt", "persisted")
    handle = sandbox.commands.run("sleep 600", background=True)
    token = sandbox._envd_access_token  # noqa: SLF001 - the SDK keeps it for the data plane

    assert sandbox.pause(keep_memory=False) is True
    assert not sandbox.is_running()
    assert sandbox.get_info().state == SandboxState.PAUSED
    assert sandbox.pause(keep_memory=False) is False  # already paused

    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=120)
    assert resumed.sandbox_id == sandbox.sandbox_id and resumed.is_running()
    # The same access token: the old handle works too.
    assert resumed._envd_access_token == token  # noqa: SLF001
    assert sandbox.files.read("/home/user/marker.txt") == "persisted"
    # A cold boot: the processes of before are gone.
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]


def test_a_timeout_pause_without_memory_keeps_only_the_files(
    make_sandbox: Callable[..., Sandbox],
) -> None:
    sandbox = make_sandbox(
        timeout=2, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}
    )
    sandbox.files.write("/home/user/kept.txt", "yes")
    eventually(
        lambda: sandbox.get_info().state,
        until=lambda state: state == SandboxState.PAUSED,
        within=10,
        every=0.1,
        what="the sandbox paused at its timeout",
    )
    Sandbox.connect(sandbox.sandbox_id, timeout=60)
    assert sandbox.files.read("/home/user/kept.txt") == "yes"


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def test_the_boot_id_read_through_files_is_the_sandboxs_and_new_after_a_cold_boot(
    make_sandbox: Callable[..., Sandbox],
) -> None:
    # As E2B's own SDK tests tell a cold boot from a resume in place.
    sandbox = make_sandbox()
    boot_before = sandbox.files.read(BOOT_ID).strip()
    assert boot_before == sandbox.commands.run(f"cat {BOOT_ID}").stdout.strip()
    assert boot_before != Path(BOOT_ID).read_text().strip()  # not the host's

    assert sandbox.pause() is True  # memory kept: the same boot
    resumed = sandbox.connect()
    assert resumed.files.read(BOOT_ID).strip() == boot_before

    assert resumed.pause(keep_memory=False) is True
    rebooted = resumed.connect()
    assert rebooted.sandbox_id == sandbox.sandbox_id
    boot_after = rebooted.files.read(BOOT_ID).strip()
    assert boot_after != boot_before and uuid.UUID(boot_after)
