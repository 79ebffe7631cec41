"""The guests' seccomp policy: the Docker-derived default profile that Debian ships
(``/usr/share/containers/seccomp.json``, package golang-github-containers-common), narrowed
for a hostile guest, as a policy text that ``sandboxd seccomp-compile`` turns into a BPF
program with libseccomp (never a hand-assembled filter).

Narrowed: the profile admits what a container with CAP_SYS_ADMIN may do (mount, unshare,
setns, ...); our guests never get that capability, and several calls are the kernel's most
exploited surface whatever the capabilities, so on top of the profile:

- no new user namespace (``clone``/``unshare`` with CLONE_NEWUSER: EPERM; ``clone3``,
  whose flags a filter cannot see, answers ENOSYS so libc falls back to ``clone``);
- no io_uring (ENOSYS), keyrings, bpf, perf events, userfaultfd, handle-based opens, the
  new mount API, mount, umount, pivot_root, setns or the kernel log (EPERM);
- sockets of the families a sandbox needs only (unix, inet, inet6, netlink): AF_VSOCK,
  AF_PACKET, AF_ALG, AF_KEY and the rest are refused.

Anything the policy does not allow answers EPERM; a call from another architecture than
x86-64's own three kills the process (a 32-bit call must not slip past the rules).

Policy lines (one rule each)::

    default errno 1
    allow NAME
    allow NAME ARG OP VALUE [MASK]      OP: eq ne lt le gt ge masked_eq
    errno NAME|NUMBER ERRNO [ARG OP VALUE [MASK]]

Rules for one call never overlap (libseccomp leaves overlapping actions unordered), and no
rule repeats the default action (libseccomp refuses that): what is not allowed is EPERM,
calls newer than libseccomp (open_tree_attr) included.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

PROFILE = Path("/usr/share/containers/seccomp.json")
# The capabilities a guest may hold (launcher/c/init.c, kept_caps): rules the profile grants only
# with one of these apply; rules it grants only without them do not.
GUEST_CAPS = {
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
}
ARCHES = {"amd64", "x86", "x32"}
CLONE_NEWUSER = 0x10000000
ALLOWED_FAMILIES = {1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK"}
DENIED = {
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "open_tree",
    "move_mount",
    "mount_setattr",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "setns",
    "syslog",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "lookup_dcookie",
    "fanotify_init",
    "quotactl",
    "quotactl_fd",
}
NOT_IMPLEMENTED = {"clone3", "io_uring_setup", "io_uring_enter", "io_uring_register"}
# Rules this module writes itself, whatever the profile says of them.
OWN = {"clone", "unshare", "socket", "socketpair"}
OPS = {
    "SCMP_CMP_EQ": "eq",
    "SCMP_CMP_NE": "ne",
    "SCMP_CMP_LT": "lt",
    "SCMP_CMP_LE": "le",
    "SCMP_CMP_GT": "gt",
    "SCMP_CMP_GE": "ge",
    "SCMP_CMP_MASKED_EQ": "masked_eq",
}


class ProfileMissing(RuntimeError):
    pass


def _applies(rule: dict[str, Any]) -> bool:
    includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
    if includes.get("arches") and not ARCHES & set(includes["arches"]):
        return False
    if includes.get("caps") and not set(includes["caps"]) <= GUEST_CAPS:
        return False
    if excludes.get("caps") and set(excludes["caps"]) & GUEST_CAPS:
        return False
    if excludes.get("arches") and ARCHES & set(excludes["arches"]):
        return False
    return not includes.get("minKernel")


def _arg(arg: dict[str, Any]) -> str:
    op = OPS[arg["op"]]
    if op == "masked_eq":  # libseccomp's order: the mask, then the value it must equal
        return f"{arg['index']} {op} {arg['value']} {arg['valueTwo']}"
    return f"{arg['index']} {op} {arg['value']}"


def policy_lines(profile: Path = PROFILE) -> list[str]:
    """The policy for every guest process, from ``profile``."""
    try:
        data = json.loads(profile.read_text())
    except FileNotFoundError:
        raise ProfileMissing(
            f"{profile} is missing: the local runtime builds its seccomp filter from it "
            "(apt-get install golang-github-containers-common; scripts/setup.sh does)"
        ) from None
    lines = [f"default errno {errno.EPERM}"]
    allowed: set[str] = set()
    for rule in data["syscalls"]:
        if rule["action"] != "SCMP_ACT_ALLOW" or not _applies(rule):
            continue
        names = [n for n in rule["names"] if n not in DENIED | NOT_IMPLEMENTED | OWN]
        args = rule.get("args") or []
        if len(args) > 1:
            continue  # the profile has none; several comparisons would be ANDed, not ORed
        for name in names:
            if args:
                lines.append(f"allow {name} {_arg(args[0])}")
            elif name not in allowed:
                allowed.add(name)
                lines.append(f"allow {name}")
    # A clone or unshare that makes a user namespace falls to the default (EPERM); any
    # other is allowed. (libseccomp refuses a rule whose action is the default's.)
    for name in ("clone", "unshare"):
        lines.append(f"allow {name} 0 masked_eq {CLONE_NEWUSER} 0")
    for family in sorted(ALLOWED_FAMILIES):
        lines.append(f"allow socket 0 eq {family}")
    lines.append("allow socketpair 0 eq 1")
    for name in sorted(NOT_IMPLEMENTED):
        lines.append(f"errno {name} {errno.ENOSYS}")
    return lines
