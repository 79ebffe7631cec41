"""Sandbox networking for the local runtime: a veth pair per sandbox, NAT through an uplink,
and E2B's egress rules in nftables.

Addresses. A sandbox's id slot (state.py, 4096 of them) is also its network slot: slot N owns
the /30 at ``cidr + 4N`` (host side ``+1``, guest side ``+2``) and the host interface
``e2b<root digest><N in hex>``. Slots are exclusive among live sandboxes, so addresses are
too, and they are reclaimed with the slot. sandboxd makes the pair (net.c); it dies with
the sandbox's network namespace, so a kill has no interface to remove.

Several runtime roots on one host. What a root installs host-wide (its range, routing
preferences, tables and marks, its nftables table, interface names, the egress port) is
claimed in the host's registry of roots first (roots.py); a claim that collides with
another root's is refused, naming that root, before anything is installed.

Routing. Traffic from the sandboxes' range (and the egress proxy's, by its mark) is routed
by its own table: a default route through the configured uplink, and nothing else (an
``unreachable`` rule after it), so sandbox traffic can only ever leave through the uplink,
whatever the host's main table says. IPv4 forwarding is switched on for the sandbox links
and the uplink only, not host-wide. Connections diverted to the egress proxy carry a mark
of their own that routes them to this host (a ``local`` default route in a second table:
TPROXY), so the proxy listens on 127.0.0.1 only.

Filtering, one table per runtime root (``inet e2bfacade_<digest>``), a fixed set of chains
and sets (see nft.py for why a sandbox is only ever set elements):

- ``outbound`` (forwarded from a sandbox): replies of established flows pass; anything not
  leaving by the uplink, or to ``blocked`` (link-local and metadata addresses, the
  sandboxes' range, the uplink's networks, operator-listed ranges), is refused; then the
  sandbox's ``allowOut`` CIDRs pass, its ``denyOut`` CIDRs (and ``0.0.0.0/0`` when internet
  access is off) are refused, and the rest passes: E2B's precedence (allow wins over deny,
  default allow). A CIDR of prefix length L is an element ``"<ifname>" . <network>`` of the
  hash sets ``allowL`` / ``denyL``, matched by masking the destination: 33 lookups per
  new flow, O(1) each, whatever the number of sandboxes.
- ``from_guest`` (to the host itself, any of its addresses): only connections diverted to
  the egress proxy; everything else is refused.
- Sandboxes with domain names in ``allowOut`` are in ``proxied``: ``divert`` hands their new
  TCP connections to ports 80 and 443 to the egress proxy (egress.py; TPROXY keeps the
  address the guest dialled), which matches the HTTP Host header or the TLS server name
  against the domains, as E2B does. While no proxy listens, TPROXY lets the connection
  through undiverted and it is judged by the sandbox's CIDR rules, as on any other port
  (never more than the proxy would allow: a name is only ever allowed by the proxy).
- Sandboxes with an ``egressProxy`` are in ``tunnelled``: ``divert`` hands *all* their new
  TCP connections (not to ``blocked``) to the egress proxy, which judges them by the same
  rules and tunnels the allowed ones through the SOCKS5 server (socks.py).
- ``proxy_out``: a socket of the egress proxy (by its mark) leaves by the uplink or not at
  all; in particular it is never delivered to the host itself, which the ``local`` table
  (``ip rule`` 0, looked up before any mark) would otherwise do for the host's addresses.
- ``postrouting`` masquerades the sandboxes' range behind the uplink's address.

Refused connections are answered (TCP reset, ICMP administratively prohibited), so a client
in the guest fails at once rather than after a timeout.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import socket
import struct
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from e2bfacade.runtime.base import CreateRefused, NetworkPolicy, RuntimeUnavailable
from e2bfacade.runtime.local.atomic import write_json
from e2bfacade.runtime.local.ids import ID_SLOTS
from e2bfacade.runtime.local.net import roots
from e2bfacade.runtime.local.net.nft import Nft, NftError, shared
from e2bfacade.runtime.local.net.rules import (
    Link,
    NetworkConfig,
    rules_for,
    ruleset,
)
from e2bfacade.runtime.local.state import Layout

log = logging.getLogger(__name__)

# Never reachable from a sandbox, whatever its rules say (with the sandboxes' range and the
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def default_route() -> tuple[str, str | None] | None:
    """The host's default route: (interface, gateway), or None when there is none."""
    try:
        out = subprocess.run(
            ["ip", "-j", "-4", "route", "show", "default"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for route in json.loads(out or "[]"):
        if route.get("dev"):
            return route["dev"], route.get("gateway")
    return None


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if check and done.returncode != 0:
        raise RuntimeUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _same_rule(line: str, rule: list[str]) -> bool:
    words = line.split()
    return all(word in words for word in rule[:-2])  # all but "pref N"


def wanted_rules(claim: roots.RootClaim) -> list[list[str]]:
    """A root's policy-routing rules (``ip rule add`` arguments)."""
    p, table, divert_table = claim.rule_pref, str(claim.route_table), str(claim.divert_table)
    net, mark, divert = claim.cidr, hex(claim.mark), hex(claim.divert_mark)
    return [
        ["to", net, "lookup", "main", "pref", str(p - 1)],
        ["fwmark", divert, "lookup", divert_table, "pref", str(p - 1)],
        ["from", net, "lookup", table, "pref", str(p)],
        ["fwmark", mark, "lookup", table, "pref", str(p)],
        ["from", net, "unreachable", "pref", str(p + 1)],
        ["fwmark", mark, "unreachable", "pref", str(p + 1)],
    ]


def table_exists(name: str) -> bool:
    wanted = {"family": "inet", "name": name}
    return any(
        wanted.items() <= item.get("table", {}).items() for item in shared().json("list tables")
    )


def installed(claim: roots.RootClaim) -> bool:
    """Whether the kernel holds anything of ``claim``: its table or any of its rules."""
    if table_exists(claim.table):
        return True
    lines = _ip("rule", "show", check=False).splitlines()
    return any(
        line.startswith(f"{rule[-1]}:") and _same_rule(line, rule)
        for rule in wanted_rules(claim)
        for line in lines
    )


def uninstall(claim: roots.RootClaim) -> None:
    """Remove what ``claim``'s root installed: its table, its rules, its route tables."""
    with contextlib.suppress(NftError):
        shared().run(f"delete table inet {claim.table}")
    for rule in wanted_rules(claim):
        for _ in range(8):  # a rule added twice (two processes at once) is there twice
            if subprocess.run(
                ["ip", "rule", "del", *rule], capture_output=True, timeout=10
            ).returncode:
                break
    for table in (claim.route_table, claim.divert_table):
        _ip("route", "flush", "table", str(table), check=False)


class SandboxNetwork:
    """The networking of one runtime root."""

    def __init__(self, layout: Layout, config: NetworkConfig, digest: str) -> None:
        self.layout = layout
        self.config = config
        self.digest = digest
        self.net = ipaddress.IPv4Network(config.cidr)
        self.ifprefix = f"e2b{digest[:4]}"
        self.table = f"e2bfacade_{digest[:8]}"
        # What this root holds host-wide: its registered claim, or (until setup() claims,
        # in a process that only releases rules or tears down) what it would claim alone.
        self.claim = roots.find(digest) or roots.RootClaim(
            root=str(layout.root),
            digest=digest,
            cidr=str(self.net),
            uplink=config.uplink,
            proxy_port=config.proxy_port or roots.DEFAULT_PROXY_PORT,
            number=roots.preferred_number(digest),
        )
        self.records = layout.root / "net"
        self.records.mkdir(mode=0o700, exist_ok=True)
        self._nft: Nft = shared()

    @property
    def mark(self) -> int:
        return self.claim.mark

    @property
    def proxy_port(self) -> int:
        return self.claim.proxy_port

    # --------------------------------------------------------------------------- setup
    def setup(self) -> None:
        """Claim the root's share of the host's network (roots.py), then make the table,
        the routes and the forwarding switches (idempotent; safe beside running sandboxes:
        their elements are kept). Raises RuntimeUnavailable, naming the other root, when
        another root of this host claims what this one needs."""
        cfg = self.config
        if not Path(f"/sys/class/net/{cfg.uplink}").exists():
            raise RuntimeUnavailable(f"the sandboxes' uplink {cfg.uplink!r} does not exist")
        with self.layout.locked("network", "setup"), roots.locked():
            try:
                self.claim = roots.claim(
                    root=self.layout.root,
                    digest=self.digest,
                    cidr=str(self.net),
                    uplink=cfg.uplink,
                    proxy_port=cfg.proxy_port,
                    installed=installed,
                )
            except roots.RootConflict as exc:
                raise RuntimeUnavailable(f"sandbox networking: {exc}") from None
            self._sysctl(f"ipv4/conf/{cfg.uplink}/forwarding", "1")
            self._routes()
            self._nft.run(
                ruleset(
                    self.table,
                    self.config.uplink,
                    self.ifprefix,
                    self.net,
                    self.blocked(),
                    self.claim.proxy_port,
                    self.claim.mark,
                    self.claim.divert_mark,
                )
            )

    @staticmethod
    def _sysctl(name: str, value: str) -> None:
        Path("/proc/sys/net", name).write_text(value)

    def _wanted_rules(self) -> list[list[str]]:
        return wanted_rules(self.claim)

    def _routes(self) -> None:
        cfg, claim = self.config, self.claim
        via = ["via", cfg.gateway] if cfg.gateway else []
        table = str(claim.route_table)
        _ip("route", "replace", "default", *via, "dev", cfg.uplink, "table", table)
        divert = str(claim.divert_table)
        _ip("route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", divert)
        existing = _ip("rule", "show")
        for rule in self._wanted_rules():
            pref = rule[-1]
            # ``ip rule show`` prints "<pref>:\t<selector> ... lookup <table>"
            if not any(
                line.startswith(f"{pref}:") and _same_rule(line, rule)
                for line in existing.splitlines()
            ):
                _ip("rule", "add", *rule)

    def never_reachable(self) -> list[ipaddress.IPv4Network]:
        """What no sandbox reaches whatever its rules, that does not change while the root
        runs: the configured ranges and the sandboxes' own."""
        return sorted(
            {ipaddress.IPv4Network(b, strict=False) for b in self.config.blocked} | {self.net}
        )

    def blocked(self) -> list[str]:
        """The ``blocked`` set: :meth:`never_reachable` and the uplink's own networks (its
        LAN, its gateway's admin pages) as they are now."""
        blocked = {str(n) for n in self.never_reachable()}
        try:
            out = _ip("-j", "-4", "addr", "show", "dev", self.config.uplink)
            for iface in json.loads(out or "[]"):
                for addr in iface.get("addr_info", []):
                    net = ipaddress.IPv4Network(
                        f"{addr['local']}/{addr['prefixlen']}", strict=False
                    )
                    blocked.add(str(net))
        except (RuntimeUnavailable, ValueError, KeyError):
            pass
        return sorted(blocked)

    def teardown(self) -> None:
        """Remove the table, the rules and the route tables, and the root's claim (a runtime
        root given up)."""
        claim = roots.find(self.digest)
        if claim is None and roots.number_free(self.claim.number, self.digest):
            claim = self.claim  # never registered: the rules it would have had, if no one's
        if claim is not None:
            uninstall(claim)
        with contextlib.suppress(NftError):
            self._nft.run(f"delete table inet {self.table}")
        roots.release(self.digest)

    # ----------------------------------------------------------------------- per slot
    def link(self, slot: int) -> Link:
        base = int(self.net.network_address) + 4 * slot
        return Link(
            ifname=f"{self.ifprefix}{slot:03x}",
            host_ip=str(ipaddress.IPv4Address(base + 1)),
            guest_ip=str(ipaddress.IPv4Address(base + 2)),
        )

    def slot_of_guest(self, address: str) -> int | None:
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            return None
        if ip not in self.net or (int(ip) - int(self.net.network_address)) % 4 != 2:
            return None
        slot = (int(ip) - int(self.net.network_address)) // 4
        return slot if slot < ID_SLOTS else None

    def _record_path(self, slot: int) -> Path:
        return self.records / f"{slot}.json"

    def record(self, slot: int) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self._record_path(slot).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return data

    def apply(self, slot: int, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Make the slot's rules those of ``policy``, replacing whatever it had (a previous
        holder's leftovers included). Atomic for the guest: one nft transaction. Crash-safe:
        the slot's record names every element that may be in the kernel before any is
        added, so a sweep can always remove them."""
        with self.layout.locked("netslot", str(slot)):
            self._apply(slot, sandbox_id, policy)

    def _apply(self, slot: int, sandbox_id: str, policy: NetworkPolicy) -> None:
        link = self.link(slot)
        new = rules_for(policy, link.ifname, self.config.dns_servers)
        old = self.record(slot)
        old_elements = [tuple(e) for e in (old or {}).get("elements", [])]
        gone = [e for e in old_elements if e not in new.elements]
        added = [e for e in new.elements if e not in old_elements]
        record = {"sandbox_id": sandbox_id, "ifname": link.ifname, **asdict(new)}
        write_json(self._record_path(slot), {**record, "elements": old_elements + added})
        self._change(gone, added)
        write_json(self._record_path(slot), record)

    def release(self, slot: int) -> None:
        """Remove the slot's rules (its sandbox is gone)."""
        with self.layout.locked("netslot", str(slot)):
            self._release(slot)

    def _release(self, slot: int) -> None:
        old = self.record(slot)
        if old is not None:
            self._change([tuple(e) for e in old.get("elements", [])], [])
        self._record_path(slot).unlink(missing_ok=True)

    def _change(self, gone: list[tuple[str, str]], added: list[tuple[str, str]]) -> None:
        t = f"inet {self.table}"
        deletes = [f"delete element {t} {s} {{ {k} }}" for s, k in gone]
        adds = [f"add element {t} {s} {{ {k} }}" for s, k in added]
        if not deletes and not adds:
            return
        try:
            self._nft.run("\n".join(deletes + adds))
        except NftError:
            # An element to delete was never added (a crash between the record and the
            # kernel): delete one by one, missing ones being fine, then add.
            for command in deletes:
                with contextlib.suppress(NftError):
                    self._nft.run(command)
            if adds:
                try:
                    self._nft.run("\n".join(adds))
                except NftError as exc:
                    raise CreateRefused(
                        f"cannot apply the sandbox's network rules: {exc}"
                    ) from None

    def set_up(self, slot: int, up: bool) -> None:
        """Bring the host side of the slot's link up or down (pause freezes traffic)."""
        name = self.link(slot).ifname.encode()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifr = struct.pack("16sh22x", name, 0)
            try:
                flags = struct.unpack("16sh22x", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
                flags = flags | IFF_UP if up else flags & ~IFF_UP
                fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", name, flags))
            except OSError as exc:
                if exc.errno != errno.ENODEV:
                    raise

    # -------------------------------------------------------------------------- sweep
    def sweep(self) -> list[int]:
        """Release the rules of slots whose sandbox no longer holds them; returns them.

        A sandbox's slot is freed only after its rules are released (driver._destroy), so
        a record whose sandbox still holds the slot is that sandbox's to release (if it
        died, the runtime's sweep destroys it, which does). What is left is a crash
        between the two. Under the slot's lock, as apply() and release(): a create taking
        the slot meanwhile is never undone."""
        released = []
        for path in self.records.glob("*.json"):
            try:
                slot = int(path.stem)
            except ValueError:
                continue
            with self.layout.locked("netslot", str(slot)):
                record = self.record(slot)
                if record is None or self.layout.slot_holder(slot) == record.get("sandbox_id"):
                    continue
                self._release(slot)
                released.append(slot)
        return released

    def interfaces(self) -> list[str]:
        """The host sides of this root's links that exist now."""
        return sorted(n for n in os.listdir("/sys/class/net") if n.startswith(self.ifprefix))

    def elements(self) -> int:
        """How many per-sandbox elements the table holds (for leak checks)."""
        total = 0
        for item in self._nft.json(f"list table inet {self.table}"):
            st = item.get("set")
            if st and st.get("name") != "blocked":
                total += len(st.get("elem", []))
        return total


CONFIG_FILE = "network.json"


def digest_of(root: Path) -> str:
    """What names a runtime root's groups, table and interfaces (see driver.py)."""
    return hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]


def save_config(layout: Layout, config: NetworkConfig | None) -> None:
    path = layout.root / "run" / CONFIG_FILE
    if config is None:
        path.unlink(missing_ok=True)
    else:
        write_json(path, config.to_json())


def load_config(layout: Layout) -> NetworkConfig | None:
    try:
        return NetworkConfig.from_json(json.loads((layout.root / "run" / CONFIG_FILE).read_text()))
    except FileNotFoundError:
        return None


def open_network(layout: Layout, given: NetworkConfig | None, digest: str) -> SandboxNetwork | None:
    """A root's networking, set up: ``given``, or as the root was last configured (a
    restart, a second process on the same root); None when there is neither."""
    config = given or load_config(layout)
    if config is None:
        return None
    network = SandboxNetwork(layout, config, digest)
    try:
        network.setup()
    except RuntimeUnavailable:
        if given is not None:
            raise
        # As last configured, but its uplink is gone: this process can still release rules
        # and kill; new sandboxes get links with no way out (fail closed).
        log.warning("sandbox networking is not set up", exc_info=True)
    if given is not None:  # set up: from now on the root's (a refused one is not)
        save_config(layout, given)
    return network
