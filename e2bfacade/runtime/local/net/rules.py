"""The rules compiler of sandbox networking: pure functions and values from a sandbox's
egress policy (E2B's allowOut / denyOut / dnsServers) and a root's configuration to
nftables set elements and the root's table (network.py installs them). No I/O here, so
tests/network/test_rules.py checks it without root."""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from e2bfacade.runtime.base import NetworkPolicy
from e2bfacade.runtime.local.ids import ID_SLOTS

# What no sandbox reaches, whatever its rules (besides the sandboxes' own range and the
# uplink's networks, added at setup, and the host's own addresses, which the input hook
# refuses and the egress proxy follows as they change): E2B's always-blocked ranges.
DEFAULT_BLOCKED = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
DEFAULT_DNS = ("8.8.8.8",)  # as E2B's templates' /etc/resolv.conf
PROXY_PORTS = (80, 443)
PREFIX = 30  # a /30 per slot: network, host side, guest side, broadcast


@dataclass(frozen=True)
class NetworkConfig:
    """How sandboxes reach the outside. ``uplink`` is the host interface their traffic
    leaves by (NATed to its address), ``gateway`` the next hop there (None: on-link)."""

    uplink: str
    gateway: str | None = None
    cidr: str = "10.250.0.0/18"
    dns_servers: tuple[str, ...] = DEFAULT_DNS
    blocked: tuple[str, ...] = DEFAULT_BLOCKED
    # The egress proxy's port on 127.0.0.1; None: chosen when the root is registered
    # (roots.py), unique among this host's roots.
    proxy_port: int | None = None
    # A PEM file of CAs the sandboxes also trust (a TLS-inspecting egress proxy's, a test
    # internet's): appended to each sandbox's /etc/ssl/certs/ca-certificates.crt.
    extra_ca: str | None = None

    def __post_init__(self) -> None:
        net = ipaddress.ip_network(self.cidr)
        if not isinstance(net, ipaddress.IPv4Network) or net.num_addresses < 4 * ID_SLOTS:
            raise ValueError(
                f"the sandbox network {self.cidr} must be an IPv4 range of at least "
                f"{4 * ID_SLOTS} addresses (a /18), one /30 per sandbox slot"
            )
        for value in (*self.dns_servers, *((self.gateway,) if self.gateway else ())):
            ipaddress.IPv4Address(value)
        for value in self.blocked:
            ipaddress.IPv4Network(value, strict=False)
        if not self.uplink or len(self.uplink) > 15 or "/" in self.uplink:
            raise ValueError(f"{self.uplink!r} is not an interface name")
        if (
            self.extra_ca is not None
            and b"BEGIN CERTIFICATE" not in Path(self.extra_ca).read_bytes()
        ):
            raise ValueError(f"{self.extra_ca} holds no PEM certificate")
        if self.proxy_port is not None and not 1 <= self.proxy_port <= 65535:
            raise ValueError(f"the egress proxy port {self.proxy_port} is not a port")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NetworkConfig:
        return cls(
            uplink=data["uplink"],
            gateway=data.get("gateway"),
            cidr=data["cidr"],
            dns_servers=tuple(data["dns_servers"]),
            blocked=tuple(data["blocked"]),
            proxy_port=None if data.get("proxy_port") is None else int(data["proxy_port"]),
            extra_ca=data.get("extra_ca"),
        )


@dataclass(frozen=True)
class Link:
    ifname: str
    host_ip: str
    guest_ip: str
    prefix: int = PREFIX

    def request(self) -> list[str]:
        """sandboxd's create parameters for this link (net.c)."""
        return [
            f"veth={self.ifname}",
            f"hostip={self.host_ip}",
            f"guestip={self.guest_ip}",
            f"prefix={self.prefix}",
        ]


@dataclass
class Rules:
    """A sandbox's egress as set elements, plus what the egress proxy needs to know."""

    elements: list[tuple[str, str]] = field(default_factory=list)  # (set, key)
    domains: list[str] = field(default_factory=list)
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    # domain pattern -> headers to write in (egress.py); placeholders, never their values
    transforms: dict[str, dict[str, str]] = field(default_factory=dict)
    # the SOCKS5 server its TCP goes out through: {"address", "username"} (no password)
    upstream: dict[str, str | None] | None = None


def _mask(length: int) -> str:
    return str(ipaddress.IPv4Address((0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF))


def is_cidr(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


def rules_for(policy: NetworkPolicy, ifname: str, default_dns: tuple[str, ...]) -> Rules:
    rules = Rules()
    allow = [e for e in policy.allow_out if is_cidr(e)]
    rules.domains = [e.lower().rstrip(".") for e in policy.allow_out if not is_cidr(e)]
    if rules.domains:  # as E2B: a name needs its resolver reachable
        dns = default_dns if policy.dns_servers is None else policy.dns_servers
        allow += [f"{d}/32" for d in dns]
    deny = list(policy.deny_out) + ([] if policy.allow_internet else ["0.0.0.0/0"])
    for kind, entries in (("allow", allow), ("deny", deny)):
        for entry in entries:
            net = ipaddress.IPv4Network(entry, strict=False)
            item = (f"{kind}{net.prefixlen}", f'"{ifname}" . {net.network_address}')
            if item not in rules.elements:
                rules.elements.append(item)
    rules.allow = [str(ipaddress.IPv4Network(e, strict=False)) for e in allow]
    rules.deny = [str(ipaddress.IPv4Network(e, strict=False)) for e in deny]
    rules.transforms = {
        domain.lower().rstrip("."): dict(headers) for domain, headers in policy.transforms
    }
    if rules.domains or rules.transforms:  # both need the proxy to see the connection
        rules.elements.append(("proxied", f'"{ifname}"'))
    if policy.upstream is not None:  # every new TCP connection, on any port
        rules.upstream = {"address": policy.upstream.address, "username": policy.upstream.username}
        rules.elements.append(("tunnelled", f'"{ifname}"'))
    return rules


def ruleset(
    table: str,
    uplink: str,
    ifprefix: str,
    net: ipaddress.IPv4Network,
    blocked: list[str],
    proxy_port: int,
    mark: int,
    divert_mark: int,
) -> str:
    """The root's whole nftables table, as one transaction's text (module docstring of
    network.py: what each chain is for). Pure: the same inputs give the same text."""
    t = f"inet {table}"
    up, prefix = uplink, f"{ifprefix}*"
    port, mark_hex, divert = proxy_port, hex(mark), hex(divert_mark)
    lines = [
        f"add table {t}",
        f"add set {t} blocked {{ type ipv4_addr; flags interval; auto-merge; }}",
        f"flush set {t} blocked",
        f"add element {t} blocked {{ {', '.join(blocked)} }}",
        f"add set {t} proxied {{ type ifname; }}",
        f"add set {t} tunnelled {{ type ifname; }}",
        # No chain of this name belongs here: one in a table made by another version
        # (a nat chain redirecting with DNAT) would fight divert. Removed if present.
        f"add chain {t} prerouting",
        f"flush chain {t} prerouting",
        f"delete chain {t} prerouting",
    ]
    for length in range(33):
        for kind in ("allow", "deny"):
            lines.append(f"add set {t} {kind}{length} {{ type ifname . ipv4_addr; }}")
    chains = {
        "forward": "type filter hook forward priority filter; policy accept;",
        "input": "type filter hook input priority filter; policy accept;",
        "divert": "type filter hook prerouting priority mangle; policy accept;",
        "proxy_out": "type filter hook output priority filter; policy accept;",
        "postrouting": "type nat hook postrouting priority srcnat; policy accept;",
        "outbound": "",
        "from_guest": "",
        "refuse": "",
    }
    for name, hook in chains.items():
        lines.append(f"add chain {t} {name} {{ {hook} }}" if hook else f"add chain {t} {name}")
        lines.append(f"flush chain {t} {name}")
    rules = {
        "forward": [
            f'iifname "{prefix}" jump outbound',
            f'oifname "{prefix}" ct state established,related accept',
            f'oifname "{prefix}" drop',
        ],
        "outbound": [
            "meta nfproto != ipv4 drop",
            # A connection diverted to the egress proxy never leaves as itself.
            f"ct mark {divert} jump refuse",
            "ct state established,related accept",
            # An egressProxy sandbox's TCP leaves only through its proxy: one the egress proxy
            # did not take (it is down: tproxy finding no socket lets the packet go on) is
            # refused, never sent as itself around the user's proxy.
            "iifname @tunnelled meta l4proto tcp jump refuse",
            f'oifname != "{up}" jump refuse',
            "ip daddr @blocked jump refuse",
            *(f"iifname . ip daddr & {_mask(n)} @allow{n} accept" for n in range(32, -1, -1)),
            *(f"iifname . ip daddr & {_mask(n)} @deny{n} jump refuse" for n in range(32, -1, -1)),
            "accept",
        ],
        "input": [f'iifname "{prefix}" jump from_guest'],
        "from_guest": [
            "meta nfproto != ipv4 drop",
            "ct state established,related accept",
            # Marked by divert, below: a guest cannot mark a packet (a mark does not
            # cross from one network namespace to another).
            f"meta mark {divert} accept",
            "jump refuse",
        ],
        "refuse": [
            "meta l4proto tcp reject with tcp reset",
            "reject with icmpx admin-prohibited",
        ],
        "divert": [
            # Every later packet of a diverted connection follows its first to the proxy.
            f'iifname "{prefix}" ct mark {divert} meta mark set {divert} accept',
            f"iifname @proxied tcp dport {{ {', '.join(map(str, PROXY_PORTS))} }} "
            f"ip daddr != @blocked ct state new tproxy ip to 127.0.0.1:{port} "
            f"meta mark set {divert} ct mark set {divert} accept",
            # An egressProxy sandbox: all its TCP, which the proxy judges and tunnels.
            f"iifname @tunnelled meta l4proto tcp "
            f"ip daddr != @blocked ct state new tproxy ip to 127.0.0.1:{port} "
            f"meta mark set {divert} ct mark set {divert} accept",
        ],
        "proxy_out": [f'meta mark {mark_hex} oifname != "{up}" jump refuse'],
        "postrouting": [f'ip saddr {net} oifname "{up}" masquerade'],
    }
    for name, body in rules.items():
        lines.extend(f"add rule {t} {name} {rule}" for rule in body)
    return "\n".join(lines)
