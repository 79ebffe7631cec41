"""The rules compiler (e2bfacade/runtime/local/net/rules.py), without root or a kernel: what
E2B's egress policy becomes as nftables set elements, and the root's table."""

from __future__ import annotations

import ipaddress

import pytest

from e2bfacade.runtime.base import NetworkPolicy
from e2bfacade.runtime.local.net.rules import NetworkConfig, is_cidr, rules_for, ruleset

DNS = ("8.8.8.8",)


def test_internet_off_is_a_deny_of_everything_that_allow_out_overrides() -> None:
    rules = rules_for(NetworkPolicy(allow_out=("1.1.1.1",)), "e2bx1", DNS)
    assert ("allow32", '"e2bx1" . 1.1.1.1') in rules.elements
    assert ("deny0", '"e2bx1" . 0.0.0.0') in rules.elements
    assert rules.allow == ["1.1.1.1/32"] and rules.deny == ["0.0.0.0/0"]
    assert rules.domains == []


def test_internet_on_denies_only_what_deny_out_names() -> None:
    rules = rules_for(
        NetworkPolicy(allow_internet=True, deny_out=("10.1.2.3/8", "203.0.113.0/24")), "i", DNS
    )
    # Masked to the network, one set per prefix length.
    assert set(rules.elements) == {("deny8", '"i" . 10.0.0.0'), ("deny24", '"i" . 203.0.113.0')}
    assert rules.deny == ["10.0.0.0/8", "203.0.113.0/24"]


def test_a_domain_opens_its_resolvers_and_marks_the_sandbox_proxied() -> None:
    policy = NetworkPolicy(allow_out=("Allowed.Example.", "*.other.example"))
    rules = rules_for(policy, "i", DNS)
    assert rules.domains == ["allowed.example", "*.other.example"]
    assert ("allow32", '"i" . 8.8.8.8') in rules.elements
    assert ("proxied", '"i"') in rules.elements
    own = rules_for(NetworkPolicy(allow_out=("a.example",), dns_servers=("1.1.1.1",)), "i", DNS)
    assert ("allow32", '"i" . 1.1.1.1') in own.elements
    assert ("allow32", '"i" . 8.8.8.8') not in own.elements


def test_the_same_range_twice_is_one_element() -> None:
    rules = rules_for(NetworkPolicy(allow_out=("1.1.1.0/24", "1.1.1.7/24")), "i", DNS)
    assert rules.elements.count(("allow24", '"i" . 1.1.1.0')) == 1


def test_cidrs_and_names_are_told_apart() -> None:
    assert is_cidr("1.1.1.1") and is_cidr("10.0.0.0/8")
    assert not is_cidr("example.com") and not is_cidr("*")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cidr", "10.250.0.0/24"),  # too small for a /30 per slot
        ("uplink", "a/b"),
        ("dns_servers", ("not-an-address",)),
        ("proxy_port", 70000),
    ],
)
def test_a_malformed_configuration_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError):
        NetworkConfig(**{"uplink": "eth0", field: value})  # type: ignore[arg-type]


def test_the_root_table_refuses_before_it_allows_and_never_delivers_proxy_sockets_locally() -> None:
    text = ruleset(
        "e2bfacade_abc",
        "eth0",
        "e2babc",
        ipaddress.IPv4Network("10.250.0.0/18"),
        ["10.250.0.0/18", "169.254.0.0/16"],
        49990,
        0x100,
        0x200,
    )
    outbound = [line for line in text.splitlines() if " outbound " in line and "add rule" in line]
    order = [r.split(" outbound ", 1)[1] for r in outbound]
    assert order.index("ip daddr @blocked jump refuse") < order.index(
        "iifname . ip daddr & 255.255.255.255 @allow32 accept"
    )
    # The most specific prefix is looked at first, allow before deny.
    allow = [i for i, r in enumerate(order) if "@allow" in r]
    deny = [i for i, r in enumerate(order) if "@deny" in r]
    assert max(allow) < min(deny) and len(allow) == len(deny) == 33
    assert (
        'add rule inet e2bfacade_abc proxy_out meta mark 0x100 oifname != "eth0" jump refuse'
        in text
    )
    assert "tproxy ip to 127.0.0.1:49990" in text
    assert 'ip saddr 10.250.0.0/18 oifname "eth0" masquerade' in text
    assert text == ruleset(
        "e2bfacade_abc",
        "eth0",
        "e2babc",
        ipaddress.IPv4Network("10.250.0.0/18"),
        ["10.250.0.0/18", "169.254.0.0/16"],
        49990,
        0x100,
        0x200,
    )
