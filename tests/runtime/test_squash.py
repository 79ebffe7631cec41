"""A deep image chain flattened into one layer keeps what a sandbox of the chain sees:
files, deletions, replaced directories, owners, modes, the environment and the start
command; the chain itself is untouched."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from e2bfacade.runtime.base import ImageBuild, SandboxSpec, StartCommand
from e2bfacade.runtime.local import LocalRuntime
from tests.runtime.helpers import ok, sh


def image_id() -> str:
    return f"sq-{uuid.uuid4().hex[:10]}"


def test_a_squashed_chain_is_one_layer_that_shows_what_the_chain_showed(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    a, b, c = (new_sandbox_id() for _ in range(3))
    runtime.create(SandboxSpec(a, "base"))
    ok(
        runtime,
        a,
        "echo 1 > /opt/one && echo keep > /opt/keep && "
        "rm -rf /etc/ssl && mkdir /etc/ssl && touch /etc/ssl/only-this && rm /etc/hostname",
    )
    ok(runtime, a, "echo mine > /home/user/own", user="user")
    s1 = image_id()
    runtime.snapshot(a, s1)
    runtime.create(SandboxSpec(b, s1))
    ok(
        runtime,
        b,
        "rm /opt/one && echo changed > /opt/keep && chmod 4750 /opt/keep && echo 2 > /opt/two",
    )
    s2 = image_id()
    runtime.snapshot(b, s2)
    top = image_id()
    runtime.build_image(
        ImageBuild(
            image_id=top,
            parent=s2,
            populate=lambda root: (root / "opt").mkdir(),
            env={"GREETING": "hi"},
            start=StartCommand(argv=("sh", "-c", "echo up > /tmp/started"), user="root"),
        )
    )

    flat = image_id()
    info = runtime.squash_image(top, flat)
    assert info.parent is None
    assert info.start is not None and info.start.argv[-1] == "echo up > /tmp/started"

    runtime.create(SandboxSpec(c, flat))
    assert sh(runtime, c, "test -e /opt/one").exit_code != 0  # deleted two layers up
    assert ok(runtime, c, "cat /opt/keep /opt/two") == "changed\n2\n"
    assert ok(runtime, c, "stat -c %a /opt/keep").strip() == "4750"
    assert ok(runtime, c, "ls -A /etc/ssl").split() == ["only-this"]
    assert sh(runtime, c, "test -e /etc/hostname").exit_code != 0
    assert ok(runtime, c, "stat -c %u:%g /home/user/own").strip() == "1000:1000"
    assert ok(runtime, c, "echo $GREETING").strip() == "hi"
    assert ok(runtime, c, "cat /tmp/started").strip() == "up"
    # The host's /usr of the base image is still bound in, not copied.
    layer = Path(runtime.root) / "images" / flat / "rootfs"
    assert not (layer / "usr" / "bin").exists()
    assert ok(runtime, c, "test -x /usr/bin/python3 && echo yes").strip() == "yes"
    # The chain it came from is unchanged and still starts sandboxes.
    assert runtime.image_info(top).parent == s2
