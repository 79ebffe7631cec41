"""A gVisor sandbox's link to the host: a named network namespace holding the guest's end of
a veth pair, which runsc hands to the sandbox's own network stack (netstack) at create and
at restore. The host reaches the guest agent and the guest's ports at the guest's address;
gVisor's stack answers, never the host kernel's.

With networking configured (``SANDBOX_UPLINK``), the link is the root's slot link
(local/net/network.py: its addresses, interface name, nftables rules and NAT), as for a local
sandbox. Without, a sandbox still needs a link for its agent: it gets one from
``100.64.0.0/10`` (shared address space, never routed here), indexed by its id range, which
is unique host-wide, and the guard table below refuses every packet the guest starts.

Guard table (``inet e2bfacade_gvisor``, one per host, idempotent): only the host's root may
connect to a sandbox's agent port (no other host account may run commands in a sandbox),
and, for links of no network (interfaces ``gvn*``), nothing from the guest reaches the host
or is forwarded anywhere but replies to the host's own connections.

The agent port's rule holds for the addresses of the set ``guarded``: the isolated range and
the sandbox network of every root that started on this host (each start adds its own, and
never removes another's: several roots, each of its own range, share the table), whatever
the range is (a configured range outside the private ones is guarded as any other).
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
from pathlib import Path

from e2bfacade.runtime.base import CreateRefused, RuntimeUnavailable
from e2bfacade.runtime.local.ids import ID_FIRST_BASE, ID_RANGE, ID_SLOTS, block_base
from e2bfacade.runtime.local.net.rules import Link

AGENT_PORT = 49983  # envd's port in an E2B sandbox
NETNS_DIR = Path("/run/netns")
ISOLATED_NET = ipaddress.IPv4Network("100.64.0.0/10")
ISOLATED_PREFIX = "gvn"
GUARD_TABLE = "e2bfacade_gvisor"
GUARDED_SET = "guarded"
# The chains are replaced (flushed and written again) at each start, in one transaction;
# the set of guarded ranges only grows (every root's range, see the module's header).
CHAINS = f"""
add table inet {GUARD_TABLE}
add set inet {GUARD_TABLE} {GUARDED_SET} {{ type ipv4_addr; flags interval; auto-merge; }}
add chain inet {GUARD_TABLE} output {{ type filter hook output priority 0; policy accept; }}
add chain inet {GUARD_TABLE} input {{ type filter hook input priority 0; policy accept; }}
add chain inet {GUARD_TABLE} forward {{ type filter hook forward priority 0; policy accept; }}
flush chain inet {GUARD_TABLE} output
flush chain inet {GUARD_TABLE} input
flush chain inet {GUARD_TABLE} forward
add rule inet {GUARD_TABLE} output tcp dport {AGENT_PORT} meta skuid != 0 \
    ip daddr @{GUARDED_SET} reject with tcp reset
add rule inet {GUARD_TABLE} input iifname "{ISOLATED_PREFIX}*" ct state established,related accept
add rule inet {GUARD_TABLE} input iifname "{ISOLATED_PREFIX}*" drop
add rule inet {GUARD_TABLE} forward iifname "{ISOLATED_PREFIX}*" drop
add rule inet {GUARD_TABLE} forward oifname "{ISOLATED_PREFIX}*" drop
"""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise CreateRefused(f"ip {' '.join(args)}: {done.stderr.strip()}")


def ensure_guard(network: ipaddress.IPv4Network | None) -> None:
    """Install the guard table, its agent rule guarding the isolated range and ``network``
    (the root's sandbox network, if it has one) besides what it already guards. Safe to
    repeat, and atomic: a packet meets the old rules or the new ones, never none."""
    ranges = ", ".join(str(n) for n in (ISOLATED_NET, network) if n is not None)
    script = CHAINS + f"add element inet {GUARD_TABLE} {GUARDED_SET} {{ {ranges} }}\n"
    done = subprocess.run(
        ["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=10, check=False
    )
    if done.returncode != 0:
        raise RuntimeUnavailable(f"nft: {done.stderr.strip()}")


def isolated_link(id_base: int) -> Link:
    """The link of a sandbox of a root without networking: a /30 of its own, by its id
    range (unique among every root's live sandboxes)."""
    index = (id_base - ID_FIRST_BASE) // ID_RANGE
    base = int(ISOLATED_NET.network_address) + 4 * index
    return Link(
        ifname=f"{ISOLATED_PREFIX}{index:x}",
        host_ip=str(ipaddress.IPv4Address(base + 1)),
        guest_ip=str(ipaddress.IPv4Address(base + 2)),
    )


def isolated_range(block: int) -> ipaddress.IPv4Network:
    """Every isolated link's addresses of the root of the id block ``block``: its slots'
    /30s, one aligned range (a /18), disjoint from every other root's."""
    first = isolated_link(block_base(block))
    size = 4 * ID_SLOTS
    return ipaddress.IPv4Network(f"{first.host_ip}/{33 - size.bit_length()}", strict=False)


def netns_name(link: Link) -> str:
    return f"e2b-{link.ifname}"


def netns_path(link: Link) -> Path:
    return NETNS_DIR / netns_name(link)


def make(link: Link) -> Path:
    """The namespace with the guest's end (``eth0``, the guest's address, a default route
    via the host's end) and the host's end (its address, up). A stale one of the same name
    (a crash, a restore) is replaced. Returns the namespace's path for the OCI bundle."""
    remove(link)
    ns = netns_name(link)
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", link.ifname, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("addr", "add", f"{link.host_ip}/{link.prefix}", "dev", link.ifname)
        # As the local launcher sets its host side (net.c): no IPv6, strict reverse-path
        # filtering (no sending from another sandbox's address); forwarding only for a
        # link of the root's network (an isolated one reaches nothing beyond the host).
        forwarding = "0" if link.ifname.startswith(ISOLATED_PREFIX) else "1"
        for knob, value in (
            (f"ipv6/conf/{link.ifname}/disable_ipv6", "1"),
            (f"ipv4/conf/{link.ifname}/rp_filter", "1"),
            (f"ipv4/conf/{link.ifname}/forwarding", forwarding),
        ):
            Path("/proc/sys/net", knob).write_text(value)
        _ip("link", "set", link.ifname, "up")
        _ip("-n", ns, "addr", "add", f"{link.guest_ip}/{link.prefix}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", link.host_ip)
    except BaseException:
        remove(link)
        raise
    return netns_path(link)


def remove(link: Link) -> None:
    """Delete the namespace (its veth pair goes with it); gone is fine."""
    if netns_path(link).exists():
        with contextlib.suppress(CreateRefused):
            _ip("netns", "delete", netns_name(link))
    with contextlib.suppress(CreateRefused):
        if Path("/sys/class/net", link.ifname).exists():
            _ip("link", "delete", link.ifname)


def cut_connections(link: Link) -> None:
    """Reset every connection the host holds to the guest (the data plane's streams, port
    forwards): gVisor cannot checkpoint a connected TCP endpoint, and a pause ends them
    on E2B too. The guest's end receives the reset and closes at once."""
    subprocess.run(
        ["ss", "-K", "dst", link.guest_ip],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=10,
        check=False,
    )
