"""Sandbox egress through the local runtime, against the suite's test internet: internet
access, allowOut / denyOut with E2B's precedence, domains, DNS, live updates, what is never
reachable, isolation between sandboxes, pause, cleanup. Every attack runs as guest root."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import BUILTIN_IMAGE, NetworkPolicy, SandboxSpec, UpstreamProxy
from e2bfacade.runtime.local import LocalRuntime
from tests.network.conftest import curl, network_config, sh
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.support.internet import TestInternet
from tests.support.waiting import eventually

WEB = "203.0.113.10"  # allowed.example
OTHER = "203.0.113.30"


def served_by(body: str) -> str:
    return str(json.loads(body)["served_by"])


def test_default_sandbox_reaches_the_internet_and_resolves_names(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    sid = make_sandbox(allow_internet=True)
    code, out = sh(net_runtime, sid, "cat /etc/resolv.conf")
    assert out.strip() == "nameserver 8.8.8.8"
    code, body = curl(net_runtime, sid, f"http://{WEB}/")
    assert code == 0 and served_by(body) == WEB, body
    # DNS through the guest's resolver (the test internet's 8.8.8.8), by name.
    code, body = curl(net_runtime, sid, "http://other.example/")
    assert code == 0 and served_by(body) == OTHER, body
    code, out = sh(net_runtime, sid, "getent hosts denied.example")
    assert out.split()[0] == "203.0.113.20", out
    # As guest user too.
    code, out = sh(net_runtime, sid, f"curl -sS -m 5 http://{WEB}/", user="user")
    assert code == 0 and served_by(out) == WEB


def test_no_internet_refuses_everything_fast(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    sid = make_sandbox(allow_internet=False)
    started = time.monotonic()
    code, _ = curl(net_runtime, sid, f"http://{WEB}/")
    assert code != 0
    assert time.monotonic() - started < 2.5, "a refused connection is answered, not dropped"
    code, out = sh(net_runtime, sid, "getent hosts allowed.example")
    assert code != 0, out


def test_allow_wins_over_deny(net_runtime: LocalRuntime, make_sandbox: Callable[..., str]) -> None:
    sid = make_sandbox(allow_internet=True, allow_out=("1.1.1.1",), deny_out=("0.0.0.0/0",))
    code, body = curl(net_runtime, sid, "http://1.1.1.1/")
    assert code == 0 and served_by(body) == "1.1.1.1"
    assert curl(net_runtime, sid, "http://8.8.8.8/")[0] != 0
    assert curl(net_runtime, sid, f"http://{WEB}/")[0] != 0


def test_deny_a_range_and_allow_one_address_in_it(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    sid = make_sandbox(allow_internet=True, deny_out=("203.0.113.0/24",), allow_out=(OTHER,))
    assert curl(net_runtime, sid, f"http://{WEB}/")[0] != 0
    assert served_by(curl(net_runtime, sid, f"http://{OTHER}/")[1]) == OTHER
    assert served_by(curl(net_runtime, sid, "http://1.1.1.1/")[1]) == "1.1.1.1"  # not denied


def test_live_update_applies_and_clears(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    sid = make_sandbox(allow_internet=True)
    assert curl(net_runtime, sid, "http://8.8.8.8/")[0] == 0
    net_runtime.update_network(sid, NetworkPolicy(allow_internet=True, deny_out=("8.8.8.8",)))
    assert curl(net_runtime, sid, "http://8.8.8.8/")[0] != 0
    assert curl(net_runtime, sid, "http://1.1.1.1/")[0] == 0
    net_runtime.update_network(sid, NetworkPolicy(allow_internet=False))
    assert curl(net_runtime, sid, "http://1.1.1.1/")[0] != 0
    net_runtime.update_network(sid, NetworkPolicy(allow_internet=True))
    assert curl(net_runtime, sid, "http://8.8.8.8/")[0] == 0
    assert curl(net_runtime, sid, "http://1.1.1.1/")[0] == 0


def test_domains_are_matched_by_name_and_dialled_by_name(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    sid = make_sandbox(allow_internet=True, allow_out=("allowed.example",), deny_out=("0.0.0.0/0",))
    code, body = curl(net_runtime, sid, "http://allowed.example/")
    assert code == 0 and served_by(body) == WEB, body
    assert curl(net_runtime, sid, "http://denied.example/")[0] != 0
    # TLS: the ClientHello's server name decides.
    code, body = curl(net_runtime, sid, "https://allowed.example/", "-k")
    assert code == 0 and served_by(body) == WEB, body
    assert curl(net_runtime, sid, "https://denied.example/", "-k")[0] != 0
    # An allowed name sent to another address reaches the allowed name's address, never
    # the one the guest chose (no borrowing an allowed name to reach another host).
    code, body = curl(
        net_runtime, sid, "http://allowed.example/", "--resolve", "allowed.example:80:203.0.113.20"
    )
    assert code == 0 and served_by(body) == WEB, body
    # "www.allowed.example" is not "allowed.example"; other ports are CIDR-only (denied).
    assert curl(net_runtime, sid, "http://www.allowed.example/")[0] != 0
    assert curl(net_runtime, sid, f"http://{WEB}:5001/")[0] != 0


def test_wildcard_domains_match_below_not_the_apex(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    sid = make_sandbox(
        allow_internet=True, allow_out=("*.allowed.example",), deny_out=("0.0.0.0/0",)
    )
    assert curl(net_runtime, sid, "http://www.allowed.example/")[0] == 0
    assert curl(net_runtime, sid, "http://allowed.example/")[0] != 0


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP service on every host address: what a guest must never reach."""
    server = socket.create_server(("0.0.0.0", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"host secret\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield port
    server.close()


def _host_addresses() -> list[str]:
    out = Path("/proc/net/fib_trie").read_text()
    found = []
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if "/32 host LOCAL" in line and i > 0:
            found.append(lines[i - 1].split()[-1])
    return sorted(set(found))


def test_the_never_reachable_list_holds_whatever_the_rules_say(
    net_runtime: LocalRuntime,
    make_sandbox: Callable[..., str],
    host_listener: int,
    internet: TestInternet,
) -> None:
    everything = ("0.0.0.0/0", "10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8", "198.18.0.0/15")
    sid = make_sandbox(allow_internet=True, allow_out=everything)
    other = make_sandbox(allow_internet=True)
    assert net_runtime.network is not None
    other_link = net_runtime.network.link(net_runtime.layout.slot_of(other) or 0)
    own_link = net_runtime.network.link(net_runtime.layout.slot_of(sid) or 0)
    targets = [*_host_addresses(), own_link.host_ip, other_link.host_ip, other_link.guest_ip]
    for address in targets:
        code, out = sh(
            net_runtime, sid, f"timeout 3 bash -c 'exec 3<>/dev/tcp/{address}/{host_listener}'"
        )
        assert code != 0, (address, out)
    for url in (
        "http://169.254.169.254/latest/meta-data/",
        f"http://{internet.gateway}/",  # the uplink's own network
        f"http://{other_link.guest_ip}/",
    ):
        assert curl(net_runtime, sid, url)[0] != 0, url
    assert curl(net_runtime, sid, f"http://{WEB}/")[0] == 0  # and the internet still works


def test_a_guest_cannot_take_another_sandboxs_address(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    sid = make_sandbox(allow_internet=True)
    other = make_sandbox(allow_internet=False)
    assert net_runtime.network is not None
    mine = net_runtime.network.link(net_runtime.layout.slot_of(sid) or 0)
    theirs = net_runtime.network.link(net_runtime.layout.slot_of(other) or 0)
    # Guest root re-addresses its interface as the other sandbox (whose rules differ).
    code, out = sh(
        net_runtime,
        sid,
        f"ip addr flush dev eth0 && ip addr add {theirs.guest_ip}/30 dev eth0 && "
        f"ip route add {mine.host_ip} dev eth0 && ip route add default via {mine.host_ip} && "
        f"curl -sS --connect-timeout 3 -m 5 http://{WEB}/",
    )
    assert WEB not in out, out


def test_pause_stops_traffic_and_resume_brings_it_back(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    sid = make_sandbox(allow_internet=True)
    assert net_runtime.network is not None
    ifname = net_runtime.network.link(net_runtime.layout.slot_of(sid) or 0).ifname
    net_runtime.pause(sid)
    flags = int(Path(f"/sys/class/net/{ifname}/flags").read_text(), 16)
    assert not flags & 1, "the host side of a paused sandbox's link is down"
    net_runtime.resume(sid)
    assert int(Path(f"/sys/class/net/{ifname}/flags").read_text(), 16) & 1
    assert curl(net_runtime, sid, f"http://{WEB}/")[0] == 0


def gone(interfaces: Callable[[], list[str]], ifname: str) -> None:
    eventually(
        interfaces,
        until=lambda names: ifname not in names,
        within=10,
        what=f"the interface {ifname} gone",
    )


def test_kill_and_a_crash_leave_no_interface_rule_or_record(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    network = net_runtime.network
    assert network is not None
    elements = network.elements()
    sid = make_sandbox(allow_internet=True, allow_out=("1.1.1.1",), deny_out=("0.0.0.0/0",))
    slot = net_runtime.layout.slot_of(sid)
    assert slot is not None and network.record(slot) is not None
    ifname = network.link(slot).ifname
    assert ifname in network.interfaces() and network.elements() > elements
    net_runtime.kill(sid)
    assert network.record(slot) is None and network.elements() == elements
    # The pair goes with the sandbox's network namespace, which the kernel tears down in
    # the background.
    gone(network.interfaces, ifname)
    # A crash: the sandbox's processes die under the service (the OOM killer, a reboot of
    # one sandbox). The sweep parks it: its rules and link go with its processes, its files
    # stay for a cold boot. Killing it then leaves nothing.
    crashed = make_sandbox(allow_internet=False)
    slot = net_runtime.layout.slot_of(crashed)
    assert slot is not None
    ifname = network.link(slot).ifname
    net_runtime.cgroups.kill_all(crashed)
    net_runtime.cgroups.wait_empty(crashed)

    # A sweep skips an id whose lock another thread holds at that moment (the runtime's
    # refill, say): the next one parks it, as the worker's next tick would.
    def parked() -> bool:
        assert crashed not in net_runtime.sweep()  # never reaped: its files stay
        record = net_runtime.layout.read_state(crashed)
        return record is not None and record.parked is not None

    eventually(parked, within=10, what="the crashed sandbox parked")
    assert network.record(slot) is None and network.elements() == elements
    gone(network.interfaces, ifname)
    net_runtime.kill(crashed)
    assert net_runtime.layout.read_state(crashed) is None
    assert network.record(slot) is None and network.elements() == elements


def test_a_restarted_service_adopts_the_network_of_running_sandboxes(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    sid = make_sandbox(allow_internet=True)
    restarted = LocalRuntime(net_runtime.root)  # what a restart sees: the disk, the kernel
    assert restarted.network is not None
    assert curl(restarted, sid, f"http://{WEB}/")[0] == 0
    restarted.update_network(sid, NetworkPolicy(allow_internet=False))
    assert curl(restarted, sid, f"http://{WEB}/")[0] != 0
    restarted.kill(sid)
    slot = net_runtime.layout.slot_of(sid)
    assert slot is None


def test_many_create_kill_cycles_leak_nothing(net_runtime: LocalRuntime) -> None:
    network = net_runtime.network
    assert network is not None
    before = (network.elements(), len(list(network.records.iterdir())))
    made: set[str] = set()
    policies = [
        NetworkPolicy(allow_internet=True),
        NetworkPolicy(allow_internet=False),
        NetworkPolicy(allow_internet=True, deny_out=("8.8.8.0/24",), allow_out=("8.8.8.8",)),
    ]
    for i in range(60):
        sid = f"cyc{i}x{time.monotonic_ns() % 100000}"
        net_runtime.create(SandboxSpec(sid, BUILTIN_IMAGE, network=policies[i % 3]))
        made.add(network.link(net_runtime.layout.slot_of(sid) or 0).ifname)
        net_runtime.kill(sid)

    assert (network.elements(), len(list(network.records.iterdir()))) == before

    eventually(
        lambda: (made & set(network.interfaces()), network.elements()),
        until=lambda left: not left[0],
        within=20,
        what="every sandbox's interface gone",
    )


def test_the_sweep_releases_only_rules_no_sandbox_holds(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str]
) -> None:
    network = net_runtime.network
    assert network is not None
    sid = make_sandbox(allow_internet=False)
    slot = net_runtime.layout.slot_of(sid)
    assert slot is not None
    # A crash between releasing a slot's rules and freeing it, from an earlier holder: a
    # record of a sandbox that no longer holds its slot.
    ghost_slot = next(s for s in range(4095, 0, -1) if net_runtime.layout.slot_holder(s) is None)
    network.apply(ghost_slot, "ghost", NetworkPolicy(allow_internet=False))
    assert network.sweep() == [ghost_slot]
    assert network.record(ghost_slot) is None
    # The live sandbox's rules are untouched: it is still refused the internet.
    assert network.record(slot) is not None
    assert curl(net_runtime, sid, f"http://{WEB}/")[0] != 0


def test_while_no_egress_proxy_listens_a_domain_sandbox_is_held_to_its_cidr_rules(
    internet: TestInternet,
) -> None:
    rt = make_runtime(network=network_config(internet))
    try:
        rt.ensure_base_image()
        sid = "noproxy" + str(time.monotonic_ns() % 100000)
        policy = NetworkPolicy(
            allow_internet=True, allow_out=("allowed.example", OTHER), deny_out=("0.0.0.0/0",)
        )
        rt.create(SandboxSpec(sid, BUILTIN_IMAGE, network=policy))
        # No proxy: the name is allowed by no one, the CIDR rules hold as on any port.
        assert curl(rt, sid, "http://allowed.example/")[0] != 0
        assert curl(rt, sid, f"http://{WEB}/")[0] != 0
        code, body = curl(rt, sid, f"http://{OTHER}/")
        assert code == 0 and served_by(body) == OTHER, body
    finally:
        destroy_runtime(rt)
        assert rt.network is not None
        rt.network.teardown()


def test_while_no_egress_proxy_listens_an_egress_proxy_sandbox_reaches_nothing(
    internet: TestInternet,
) -> None:
    """An egressProxy sandbox's TCP leaves only through the user's SOCKS server: with no
    egress proxy to tunnel it, it is refused, never sent around the user's proxy."""
    rt = make_runtime(network=network_config(internet))
    try:
        rt.ensure_base_image()
        sid = "notunnel" + str(time.monotonic_ns() % 100000)
        policy = NetworkPolicy(allow_internet=True, upstream=UpstreamProxy(f"{OTHER}:1080"))
        rt.create(SandboxSpec(sid, BUILTIN_IMAGE, network=policy))
        assert curl(rt, sid, f"http://{WEB}/")[0] != 0
        assert curl(rt, sid, f"http://{OTHER}/")[0] != 0
    finally:
        destroy_runtime(rt)
        assert rt.network is not None
        rt.network.teardown()
