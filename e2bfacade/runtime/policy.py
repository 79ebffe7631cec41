"""A sandbox's network policy (part of the interface, :mod:`.base`, which re-exports it):
its egress rules, the headers its egress proxy writes, the upstream it tunnels through."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpstreamProxy:
    """E2B's ``egressProxy``: a SOCKS5 server (``host:port``) the sandbox's outbound TCP is
    tunnelled through, with RFC 1929 credentials when ``username`` is set. The password is
    not here: the egress proxy asks its resolver for it when it connects (kind
    ``egressProxy``), so it is on no runtime record."""

    address: str
    username: str | None = None


@dataclass(frozen=True)
class NetworkPolicy:
    """A sandbox's egress, as E2B defines it. ``allow_internet`` off is ``deny_out`` of
    ``0.0.0.0/0``; an address matching ``allow_out`` (CIDRs, or domain names matched by the
    HTTP Host header or TLS server name on ports 80 and 443) is allowed even when it matches
    ``deny_out`` (CIDRs only); anything matched by neither is allowed. ``dns_servers`` are
    the resolvers opened when ``allow_out`` names a domain (None: the driver's default).
    Drivers without ``Capability.INTERNET_ACCESS`` (base.py) accept only the isolated default."""

    allow_internet: bool = False
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    dns_servers: tuple[str, ...] | None = None
    # E2B's ``rules``: per domain pattern, the headers the egress proxy writes into the
    # sandbox's HTTP requests to it (values may hold ``${e2b.secrets.<name>}``, resolved on
    # the way out). A domain here is not thereby allowed.
    transforms: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    # E2B's ``egressProxy``: every new outbound TCP connection the rules allow goes out
    # through it (domain-matched ones by name: the SOCKS server resolves them).
    upstream: UpstreamProxy | None = None

    @property
    def is_isolated(self) -> bool:
        """No egress at all: what a driver without networking gives every sandbox."""
        return not (self.allow_internet or self.allow_out)
