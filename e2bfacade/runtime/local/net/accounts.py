"""The host's accounts and the sandboxes' addresses: only the service's own account may
open a connection to a sandbox's address from the host.

A sandbox's ports are meant to be reached through the data plane only, which checks the
sandbox's traffic access token (``allowPublicTraffic: false``) and never forwards to the
agent's port. But a sandbox's guest side has an address on a veth link of the host (its
network slot's, or for a gVisor sandbox of a root without networking, an isolated link's),
and the host's kernel routes any local account's connection there: without this guard,
``nobody`` on the host connects to every port of every sandbox directly.

Each runtime root with addressable sandboxes has a table of its own,
``inet e2bfacade_<digest>_accounts``: its ``output`` chain refuses (a TCP reset, else ICMP
administratively prohibited) every *new* connection the host starts to the root's ranges
from a socket whose owner is not the service's account. What passes:

- the service's own dials: the gVisor driver's agent and port forwarding over TCP, the
  start command's readiness check; the local driver dials from inside the sandbox's network
  namespace (netns.py), where this hook of the host does not run at all;
- replies, of any socket: only new connections are judged;
- the sandboxes' own traffic: it is forwarded (the root's table, network.py), or comes in
  to the host (the input hook), never through the host's output hook as a new connection
  of a local socket.

The table is made when a process opens the root (idempotent: one transaction replaces its
set and rules, so there is no moment without them) and removed with the root's other rules
by ``manage.py teardown_root``. Its ranges are the root's alone (its claimed network range;
its block's share of the isolated links), so several roots' tables never judge one
another's sandboxes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterable

from e2bfacade.runtime.base import RuntimeUnavailable
from e2bfacade.runtime.local.net.nft import NftError, shared


def table_of(digest: str) -> str:
    """The guard table of the root of ``digest`` (network.digest_of)."""
    return f"e2bfacade_{digest[:8]}_accounts"


def ruleset(table: str, ranges: Iterable[ipaddress.IPv4Network], uid: int) -> str:
    """The guard table as one transaction's text: new connections to ``ranges`` from a
    socket not owned by ``uid`` are refused. Pure: the same inputs give the same text."""
    t = f"inet {table}"
    guarded = sorted({ipaddress.IPv4Network(r) for r in ranges})
    lines = [
        f"add table {t}",
        f"add set {t} guests {{ type ipv4_addr; flags interval; auto-merge; }}",
        f"flush set {t} guests",
        *([f"add element {t} guests {{ {', '.join(map(str, guarded))} }}"] if guarded else []),
        f"add chain {t} output {{ type filter hook output priority filter; policy accept; }}",
        f"flush chain {t} output",
    ]
    # A packet with no full socket (the kernel's own resets and ICMP errors, a listener's
    # handshake answers) has no owner: `meta skuid` does not match it, so it passes.
    judged = f"ip daddr @guests ct state new meta skuid != {uid}"
    lines += [
        f"add rule {t} output {judged} meta l4proto tcp reject with tcp reset",
        f"add rule {t} output {judged} reject with icmpx admin-prohibited",
    ]
    return "\n".join(lines)


def install(digest: str, ranges: Iterable[ipaddress.IPv4Network], uid: int | None = None) -> None:
    """Make (or replace) the guard of the root of ``digest``: only ``uid`` (the service's
    account: this process's by default) opens connections to ``ranges``. With no range (a
    local root without networking: its sandboxes have their own loopback only) the table is
    removed instead.
    Raises RuntimeUnavailable when the rules cannot be installed (fail closed: the root
    does not start with its sandboxes open to every account)."""
    guarded = list(ranges)
    if not guarded:
        remove(digest)
        return
    try:
        shared().run(ruleset(table_of(digest), guarded, os.geteuid() if uid is None else uid))
    except NftError as exc:
        raise RuntimeUnavailable(f"cannot guard the sandboxes' addresses: {exc}") from None


def remove(digest: str) -> None:
    """Delete the guard of the root of ``digest``; gone (or no nftables at all) is fine."""
    with contextlib.suppress(NftError, RuntimeUnavailable):
        shared().run(f"delete table inet {table_of(digest)}")
