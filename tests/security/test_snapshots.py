"""A snapshot keeps what gives a file its powers and its owners' rights: setuid and setgid
bits, file capabilities (for the restored sandbox's own root, never the host's), POSIX ACLs
and the user's xattrs. A guest cannot use a snapshot to gain what it did not have."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pytest

from e2bfacade.runtime.base import SandboxSpec
from e2bfacade.runtime.local import HostRuntime
from tests.runtime.helpers import ok, sh
from tests.security.drivers import only_on

# Runs in the guest as root: an ACL granting uid 4321 read on /opt/acl (u32 version 2,
# then (u16 tag, u16 perm, u32 id): USER_OBJ rw, USER 4321 r, GROUP_OBJ r, MASK r, OTHER 0)
# and two xattrs of the user's.
SET_XATTRS = r"""
import os, struct
acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in (
    (1, 6, 0xFFFFFFFF), (2, 4, 4321), (4, 4, 0xFFFFFFFF), (0x10, 4, 0xFFFFFFFF),
    (0x20, 0, 0xFFFFFFFF)))
open("/opt/acl", "w").write("acl")
os.setxattr("/opt/acl", "system.posix_acl_access", acl)
os.mkdir("/opt/acl-dir")
os.setxattr("/opt/acl-dir", "system.posix_acl_default", acl)
os.setxattr("/opt/acl", "user.e2b.owner", b"kept")
"""

GET_XATTRS = r"""
import os, struct
for path, name in (("/opt/acl", "system.posix_acl_access"),
                   ("/opt/acl-dir", "system.posix_acl_default")):
    raw = os.getxattr(path, name)
    entries = [struct.unpack_from("<HHI", raw, 4 + 8 * i) for i in range((len(raw) - 4) // 8)]
    print(sorted(ident for tag, _, ident in entries if tag == 2))
print(os.getxattr("/opt/acl", "user.e2b.owner").decode())
"""


GVISOR_HAS_NONE = (
    "gVisor (runsc 20240729) has no file capabilities, POSIX ACLs or xattrs (EOPNOTSUPP) and "
    "ignores setuid/setgid bits at exec: test_a_gvisor_snapshot_keeps_modes_and_gives_"
    "nothing holds what applies"
)


def test_a_snapshot_keeps_setuid_setgid_capabilities_acls_and_xattrs(
    runtime: HostRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    only_on(runtime, "local", GVISOR_HAS_NONE)
    a, b = new_sandbox_id(), new_sandbox_id()
    runtime.create(SandboxSpec(a, "base"))
    ok(
        runtime,
        a,
        "echo only-root > /root/secret && chmod 600 /root/secret && "
        "cp /usr/bin/id /opt/rootid && chmod 4755 /opt/rootid && "
        "cp /usr/bin/id /opt/groupid && chgrp 42 /opt/groupid && chmod 2755 /opt/groupid && "
        "mkdir /opt/shared && chgrp 42 /opt/shared && chmod 3775 /opt/shared && "
        "cp /usr/bin/cat /opt/capcat && setcap cap_dac_override+ep /opt/capcat",
    )
    ok(runtime, a, f"python3 -c '{SET_XATTRS}'")
    # Before the snapshot: the setuid program and the capability work for user.
    assert ok(runtime, a, "/opt/rootid -u; /opt/capcat /root/secret", user="user").split() == [
        "0",
        "only-root",
    ]
    snap = f"snap-{uuid.uuid4().hex[:10]}"
    runtime.snapshot(a, snap)
    runtime.create(SandboxSpec(b, snap))

    modes = ok(runtime, b, "stat -c '%a %g' /opt/rootid /opt/groupid /opt/shared").split()
    assert modes == ["4755", "0", "2755", "42", "3775", "42"]
    assert ok(runtime, b, "/opt/rootid -u; /opt/groupid -g", user="user").split() == ["0", "42"]
    assert "cap_dac_override=ep" in ok(runtime, b, "getcap /opt/capcat")
    # The capability is the restored sandbox's root's: effective there...
    assert ok(runtime, b, "/opt/capcat /root/secret", user="user") == "only-root\n"
    assert ok(runtime, b, f"python3 -c '{GET_XATTRS}'").split("\n")[:3] == [
        "[4321]",
        "[4321]",
        "kept",
    ]
    # ...and in the image it names the image's own root: a v2 value (no rootid: the root of
    # whichever sandbox mounts the layer) or a v3 one for guest id 0. Never the old
    # sandbox's host id, which another sandbox may hold next.
    image = runtime.root / "images" / snap / "rootfs"
    raw = os.getxattr(image / "opt/capcat", "security.capability")
    revision = int.from_bytes(raw[:4], "little") >> 24
    assert (revision, len(raw)) == (2, 20) or (revision, raw[20:]) == (3, bytes(4))
    assert os.stat(image / "opt/rootid").st_uid == 0  # a guest id: the image holds guest ids
    # A guest user still cannot make itself a setuid root program through a snapshot.
    assert (
        sh(
            runtime,
            b,
            "cp /usr/bin/id /tmp/mine && chmod 4755 /tmp/mine && chown 0 /tmp/mine",
            user="user",
        ).exit_code
        != 0
    )


@pytest.mark.sandboxer
def test_a_gvisor_snapshot_keeps_modes_and_gives_nothing(
    runtime: HostRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    only_on(runtime, "gvisor", "the local driver's: the test above")
    a, b = new_sandbox_id(), new_sandbox_id()
    runtime.create(SandboxSpec(a, "base"))
    ok(
        runtime,
        a,
        "echo only-root > /root/secret && chmod 600 /root/secret && "
        "cp /usr/bin/id /opt/rootid && chmod 4755 /opt/rootid && "
        "cp /usr/bin/id /opt/groupid && chgrp 42 /opt/groupid && chmod 2755 /opt/groupid && "
        "mkdir /opt/shared && chgrp 42 /opt/shared && chmod 3775 /opt/shared",
    )
    # No file capabilities, ACLs or xattrs at all: refused, so none can be carried.
    for refused in (
        "cp /usr/bin/cat /opt/capcat && setcap cap_dac_override+ep /opt/capcat",
        f"python3 -c '{SET_XATTRS}'",
        'echo x > /opt/x && python3 -c \'import os; os.setxattr("/opt/x", "user.a", b"1")\'',
    ):
        result = sh(runtime, a, refused)
        assert result.exit_code != 0 and b"not supported" in result.stderr, result
    snap = f"snap-{uuid.uuid4().hex[:10]}"
    runtime.snapshot(a, snap)
    runtime.create(SandboxSpec(b, snap))

    modes = ok(runtime, b, "stat -c '%a %g' /opt/rootid /opt/groupid /opt/shared").split()
    assert modes == ["4755", "0", "2755", "42", "3775", "42"]
    # The setuid and setgid bits give guest user nothing, before a snapshot or after.
    assert ok(runtime, b, "/opt/rootid -u; /opt/groupid -g", user="user").split() == [
        "1000",
        "1000",
    ]
    assert sh(runtime, b, "cat /root/secret", user="user").exit_code != 0
    image = runtime.root / "images" / snap / "rootfs"
    assert os.stat(image / "opt/rootid").st_uid == 0  # a guest id: the image holds guest ids
    assert (
        sh(
            runtime,
            b,
            "cp /usr/bin/id /tmp/mine && chmod 4755 /tmp/mine && chown 0 /tmp/mine",
            user="user",
        ).exit_code
        != 0
    )
