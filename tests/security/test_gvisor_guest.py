"""Attacks on what the gvisor driver adds: the sandbox's link to the host (a veth whose host
side the guest routes through), the agent on TCP, the helper mounted from the host, and
gVisor's own kernel between the guest and the host's. Each is made from inside a gVisor
sandbox, bounded to a few seconds, with traffic only to loopback and the sandboxes' own
addresses. Skipped where runsc is missing."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import ProcessSpec, SandboxSpec
from e2bfacade.runtime.gvisor.driver import GvisorRuntime
from e2bfacade.runtime.gvisor.link import AGENT_PORT
from e2bfacade.runtime.local.net.rules import NetworkConfig
from tests.network.conftest import unique_port
from tests.runtime.conftest import destroy_runtime, make_gvisor_runtime
from tests.runtime.helpers import ok, run, sh
from tests.support.internet import TestInternet

# Runs in the guest: connects to every (host, port) of argv[1] (JSON) at once, each bounded
# to 1.5 s, and prints what each got ("connected" is the attack succeeding).
CONNECT = r"""
import errno, json, socket, sys, threading
targets, out = json.loads(sys.argv[1]), {}
def attempt(host, port):
    s = socket.socket(); s.settimeout(1.5)
    try:
        s.connect((host, port)); out[f"{host}:{port}"] = "connected"
    except socket.timeout:
        out[f"{host}:{port}"] = "timeout"
    except OSError as e:
        out[f"{host}:{port}"] = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
threads = [threading.Thread(target=attempt, args=tuple(t)) for t in targets]
[t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps(out))
"""
COMMON_PORTS = (22, 53, 80, 443, 2375, 5432, 6379, 8000, 8080, 11211)


@pytest.fixture
def rt(gvisor_runtime: GvisorRuntime) -> GvisorRuntime:
    return gvisor_runtime


@pytest.fixture
def new_gvisor_sandbox(rt: GvisorRuntime) -> Iterator[Callable[..., str]]:
    """Creates gVisor sandboxes of the base image; all killed at teardown."""
    made: list[str] = []

    def create(memory_mb: int = 512) -> str:
        sid = f"v{uuid.uuid4().hex[:12]}"
        made.append(sid)
        rt.create(SandboxSpec(sid, "base", memory_mb=memory_mb))
        return sid

    yield create
    for sid in made:
        rt.kill(sid)


def connect_from(rt: GvisorRuntime, sid: str, targets: list[tuple[str, int]]) -> dict[str, str]:
    result = run(rt, sid, ["python3", "-c", CONNECT, json.dumps(targets)], user="root")
    assert result.exit_code == 0, result
    got: dict[str, str] = json.loads(result.stdout)
    assert len(got) == len(targets), got
    return got


def listener(host: str) -> socket.socket:
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(8)
    sock.setblocking(False)
    return sock


def accepted(sock: socket.socket) -> list[str]:
    peers: list[str] = []
    while True:
        try:
            conn, peer = sock.accept()
        except BlockingIOError:
            return peers
        conn.close()
        peers.append(peer[0])


def test_the_guest_reaches_no_host_service_through_its_link(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    sid = new_gvisor_sandbox()
    link = rt.sandboxer.link_of(sid)
    # Host services of the test's own: on every address (so on the link's host side too)
    # and on the host's loopback only.
    everywhere, loopback = listener("0.0.0.0"), listener("127.0.0.1")
    try:
        open_port, local_port = everywhere.getsockname()[1], loopback.getsockname()[1]
        targets = [(link.host_ip, p) for p in (*COMMON_PORTS, open_port, local_port)]
        # The guest's 127.0.0.1 is gVisor's own loopback: never the host's.
        targets += [("127.0.0.1", local_port), ("127.0.0.1", open_port)]
        got = connect_from(rt, sid, targets)
        assert "connected" not in got.values(), got
        assert accepted(everywhere) == [] and accepted(loopback) == []
    finally:
        everywhere.close()
        loopback.close()


def test_a_guest_reaches_no_other_sandbox_nor_its_agent(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    attacker, victim = new_gvisor_sandbox(), new_gvisor_sandbox()
    theirs = rt.sandboxer.link_of(victim)
    # The victim serves a port on every address for 4 s and reports who connected.
    serve = (
        "import socket, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('0.0.0.0', 8000)); s.listen(8); s.settimeout(0.2); print('up', flush=True)\n"
        "peers, end = [], time.time() + 4\n"
        "while time.time() < end:\n"
        "    try:\n        c, peer = s.accept(); peers.append(peer[0]); c.close()\n"
        "    except OSError:\n        pass\n"
        "print(' '.join(peers) or 'none', flush=True)\n"
    )
    proc = rt.guest(victim).start_process(ProcessSpec(("python3", "-c", serve), timeout=10))
    try:
        output = iter(proc.output())
        assert next(output)[1] == b"up\n"
        got = connect_from(
            rt,
            attacker,
            [
                (theirs.guest_ip, AGENT_PORT),  # its agent: commands as its root
                (theirs.guest_ip, 8000),  # its service
                (theirs.host_ip, AGENT_PORT),
                (theirs.host_ip, 8000),
            ],
        )
        assert "connected" not in got.values(), got
        rt.guest(victim).connect_port(8000).close()  # the host may: the service is up
        peers = b"".join(data for _, data in output).decode().split()
        assert peers == [theirs.host_ip], peers  # the host's one connection, no other
    finally:
        proc.send_signal(9)
        proc.close()


def test_usr_and_the_agent_binary_stay_read_only(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    sid = new_gvisor_sandbox()
    helper = rt.root / "sandboxes" / sid / "helper" / "sandboxd"
    before = hashlib.sha256(helper.read_bytes()).hexdigest()
    usr_before = sorted(os.listdir("/usr/bin"))
    for user in ("root", "user"):
        for attack in (
            "echo x > /usr/bin/e2bt-planted",
            "echo x >> /run/e2b/sandboxd",
            "truncate -s 0 /run/e2b/sandboxd",
            "printf x | dd of=/run/e2b/sandboxd conv=notrunc",
            "rm -f /run/e2b/sandboxd",
            "mv /run/e2b/sandboxd /run/e2b/old",
            "chmod 777 /run/e2b/sandboxd",
            "mount -o remount,rw /run/e2b",
            "umount -l /run/e2b",
            "touch /run/e2b/new",
        ):
            assert sh(rt, sid, attack, user=user).exit_code != 0, (user, attack)
    assert ok(rt, sid, "stat -c '%a %u' /run/e2b/sandboxd").split() == ["555", "0"]
    assert hashlib.sha256(helper.read_bytes()).hexdigest() == before
    assert sorted(os.listdir("/usr/bin")) == usr_before
    assert ok(rt, sid, "echo alive") == "alive\n"  # the agent is the one it was


def test_overwriting_the_agent_binary_fails_and_the_sandbox_lives_on(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    sid = new_gvisor_sandbox()
    attack = "open('/run/e2b/sandboxd', 'wb')"
    result = run(rt, sid, ["python3", "-c", attack], timeout=5)
    assert result.exit_code == 1 and b"Read-only file system" in result.stderr, result
    assert ok(rt, sid, "echo alive") == "alive\n"


def test_the_guests_proc_shows_only_its_sandbox(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    sid = new_gvisor_sandbox()
    names = ok(rt, sid, "cat /proc/[0-9]*/comm", user="user").split()
    assert names[:2] == ["e2b-init", "e2b-agent"] and len(names) < 10, names
    # None of the host's processes: not this test's, not the sentry, gofer or runsc.
    state = rt.sandboxer.runsc.state(rt.sandboxer.cid(sid)) or {}
    for pid in (os.getpid(), int(state.get("pid") or 0)):
        assert sh(rt, sid, f"cat /proc/{pid}/cmdline", user="root").exit_code != 0, pid
    seen = ok(rt, sid, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; cat /proc/mounts")
    for host_word in ("runsc", "pytest", str(rt.root), "sandboxes/"):
        assert host_word not in seen, host_word


def test_the_kernel_the_guest_sees_is_gvisors(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    sid = new_gvisor_sandbox()
    dmesg = ok(rt, sid, "dmesg", user="user")
    assert "Starting gVisor" in dmesg
    host_log = Path("/proc/version").read_text()
    version = ok(rt, sid, "uname -r; cat /proc/version", user="user")
    assert os.uname().release not in version and version.split("\n")[1] != host_log.strip()
    # No host kernel interface behind it: modules, kernel symbols, the host's devices.
    for probe in ("cat /proc/modules", "cat /proc/kallsyms", "ls /dev/kmsg /dev/mem /dev/sda"):
        assert sh(rt, sid, probe).exit_code != 0, probe


@pytest.mark.timeout(60)  # a backstop: each step is bounded below
def test_filling_its_memory_kills_the_guests_process_and_nothing_else(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    hog_sandbox, other = new_gvisor_sandbox(memory_mb=256), new_gvisor_sandbox(memory_mb=256)
    hog = (
        "chunks = []\n"
        "while True:\n"
        "    chunks.append(bytearray(16 << 20))\n"  # written, so every page is real
    )
    result = run(rt, hog_sandbox, ["python3", "-c", hog], timeout=20)
    # Killed (SIGKILL, shown as exit 1 or a signal) or refused memory (MemoryError): ended.
    assert result.exit_code != 0 or result.signal is not None, result
    assert ok(rt, hog_sandbox, "echo alive") == "alive\n"
    assert ok(rt, other, "echo alive") == "alive\n"
    assert rt.status(hog_sandbox).state.value == "running"


@pytest.mark.timeout(60)  # a hang guard; the bound that matters is the call's, below
def test_a_guest_whose_kernel_dies_of_memory_never_holds_the_hosts_call(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    sid = new_gvisor_sandbox(memory_mb=256)
    started = time.monotonic()
    result = sh(rt, sid, "head -c 1G /dev/zero > /dev/fill", timeout=5)
    # Its own 5 s, and room for a loaded machine: the sandbox's start is not counted (it
    # took most of the old 15 s of the whole test while other lines shared the cores).
    assert time.monotonic() - started < 15
    assert result.exit_code != 0 or result.signal is not None


# Runs in the guest as user: a user namespace of its own, then a packet socket on eth0 for
# 3 s; prints whether the marker went by.
SNIFF = r"""
import ctypes, socket, time
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
    raise SystemExit("no user namespace")
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.settimeout(0.2)
print("sniffing", flush=True)
seen, end = b"", time.time() + 3
while time.time() < end:
    try:
        seen += s.recv(65536)
    except OSError:
        pass
print("SEEN" if b"ROOTS-OWN-" + b"SECRET" in seen else "nothing", flush=True)
"""


def test_guest_user_cannot_sniff_what_root_runs_through_the_agent(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    sid = new_gvisor_sandbox()
    sniffer = rt.guest(sid).start_process(
        ProcessSpec(("python3", "-c", SNIFF), user="user", timeout=10)
    )
    try:
        output = iter(sniffer.output())
        first = next(output)[1]
        if first == b"sniffing\n":
            ok(rt, sid, "echo ROOTS-OWN-SECRET > /root/secret")
            first += b"".join(data for _, data in output)
        assert b"SEEN" not in first, first
    finally:
        sniffer.send_signal(9)
        sniffer.close()


# Runs in the guest: every way to the agent a guest has, tried (TCP to its port from each
# source address it can take, to each of its addresses, IPv4 and IPv6, and every unix socket
# on its file system), each with a start frame asking for ``id`` as uid 0; prints what each
# answered. An answer holding "uid=0" is the attack succeeding.
REACH_AGENT = r"""
import json, os, socket, stat, struct, sys
port, own = int(sys.argv[1]), sys.argv[2]
items = b"".join(i + b"\0" for i in (b"uid=0", b"gid=0", b"cwd=/", b"arg=/usr/bin/id"))
start = struct.pack(">I", len(items) + 1) + b"S" + items

def exchange(sock, address):
    sock.settimeout(1.5)
    try:
        sock.connect(address)
        sock.sendall(start)
        got = b""
        while b"uid=" not in got:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got.decode(errors="replace") or "nothing"
    except OSError as e:
        return type(e).__name__
    finally:
        sock.close()

def tcp(family, source, target):
    sock = socket.socket(family)
    if source is not None:
        try:
            sock.bind((source, 0))
        except OSError as e:
            return "bind " + type(e).__name__
    return exchange(sock, (target, port))

def sockets():
    for top, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/usr")]
        for name in files:
            path = os.path.join(top, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    yield path
            except OSError:
                pass

out = {}
for source in (None, "127.0.0.1", own):
    for target in ("127.0.0.1", own):
        out[f"{source}->{target}"] = tcp(socket.AF_INET, source, target)
out["::1->::1"] = tcp(socket.AF_INET6, "::1", "::1")
out["::->::1"] = tcp(socket.AF_INET6, None, "::1")
for path in sockets():
    out[path] = exchange(socket.socket(socket.AF_UNIX), path)
print(json.dumps(out))
"""


def test_guest_user_reaches_the_agent_from_no_address_of_the_guest(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    sid = new_gvisor_sandbox()
    own = rt.sandboxer.link_of(sid).guest_ip
    argv = ["python3", "-c", REACH_AGENT, str(AGENT_PORT), own]
    result = run(rt, sid, argv, user="user", timeout=60)
    assert result.exit_code == 0, result
    got: dict[str, str] = json.loads(result.stdout)
    assert len(got) >= 6, got  # every TCP way was tried
    assert not [way for way, answer in got.items() if "uid=" in answer], got
    assert ok(rt, sid, "id -u") == "0\n"  # the host's way still serves


# Runs in the guest: takes the agent's port on every address (SO_REUSEADDR|SO_REUSEPORT,
# as any user may) and every unix socket it can replace, says "ready", then for 4 s accepts
# and reads whatever comes; prints what it took and what it read.
STEAL_AGENT = r"""
import json, os, select, socket, stat, sys, time
port, own = int(sys.argv[1]), sys.argv[2]
listeners, taken = [], []
for family, host in ((socket.AF_INET, own), (socket.AF_INET, "0.0.0.0"),
                     (socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::")):
    s = socket.socket(family)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((host, port)); s.listen(8); listeners.append(s); taken.append(host)
    except OSError:
        s.close()
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/usr")]
    for name in files:
        path = os.path.join(top, name)
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
            os.unlink(path)
        except OSError:
            continue
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(path); s.listen(8); listeners.append(s); taken.append(path)
        except OSError:
            s.close()
print("ready " + json.dumps(taken), flush=True)
read, end = b"", time.time() + 4
while time.time() < end:
    for s in select.select(listeners, [], [], 0.1)[0]:
        conn, _ = s.accept()
        conn.settimeout(0.5)
        try:
            read += conn.recv(65536)
        except OSError:
            pass
        conn.close()
print("read " + json.dumps(read.decode(errors="replace")), flush=True)
"""


def test_guest_user_cannot_take_the_agents_port_nor_the_hosts_commands(
    rt: GvisorRuntime, new_gvisor_sandbox: Callable[..., str]
) -> None:
    sid = new_gvisor_sandbox()
    own = rt.sandboxer.link_of(sid).guest_ip
    argv = ("python3", "-c", STEAL_AGENT, str(AGENT_PORT), own)
    thief = rt.guest(sid).start_process(ProcessSpec(argv, user="user", timeout=30))
    try:
        output = iter(thief.output())
        ready = next(output)[1]
        assert ready.startswith(b"ready "), ready
        try:  # the host's next exchange: a root command carrying a secret
            answer: str | BaseException = ok(rt, sid, "echo ROOTS-OWN-$((6*7)) && id -u")
        except Exception as exc:  # noqa: BLE001 - a stolen exchange fails; asserted below
            answer = exc
        read = b"".join(data for _, data in output)
        assert b"ROOTS-OWN" not in read, (ready, read)
        assert answer == "ROOTS-OWN-42\n0\n", (ready, answer)
    finally:
        thief.send_signal(9)
        thief.close()


# A range outside every private one: only ever a range of local namespaces here (the test
# internet is the uplink), never routed anywhere.
PUBLIC_LOOKING_CIDR = "198.19.0.0/18"

# Run on the host as ``nobody``: the agent's exchange, a start frame asking for ``id`` as
# uid 0, to argv[1]:argv[2]; prints the answer ("uid=0" is the attack succeeding).
HOST_START_ROOT = r"""
import socket, struct, sys
items = b"".join(i + b"\0" for i in (b"uid=0", b"gid=0", b"cwd=/", b"arg=/usr/bin/id"))
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
    s.settimeout(2)
    s.sendall(struct.pack(">I", len(items) + 1) + b"S" + items)
    got = b""
    while b"uid=" not in got:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    print(got.decode(errors="replace") or "nothing")
except OSError as e:
    print(type(e).__name__)
"""


@pytest.fixture(scope="module")
def gvisor_on_a_public_looking_range() -> Iterator[GvisorRuntime]:
    with TestInternet() as internet:
        config = NetworkConfig(
            uplink=internet.uplink,
            gateway=internet.gateway,
            cidr=PUBLIC_LOOKING_CIDR,
            dns_servers=("8.8.8.8",),
            proxy_port=unique_port(),
        )
        rt = make_gvisor_runtime(network=config)
        assert isinstance(rt, GvisorRuntime)
        try:
            rt.ensure_base_image()
            yield rt
        finally:
            destroy_runtime(rt)
            assert rt.network is not None
            rt.network.teardown()


def test_a_host_account_cannot_run_commands_in_a_sandbox_of_a_range_outside_the_private_ones(
    gvisor_on_a_public_looking_range: GvisorRuntime,
) -> None:
    rt = gvisor_on_a_public_looking_range
    sid = f"v{uuid.uuid4().hex[:12]}"
    rt.create(SandboxSpec(sid, "base"))
    try:
        guest_ip = rt.sandboxer.link_of(sid).guest_ip
        assert guest_ip.startswith("198.19."), guest_ip
        done = subprocess.run(
            ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", HOST_START_ROOT,
             guest_ip, str(AGENT_PORT)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "uid=" not in done.stdout, done.stdout
        assert ok(rt, sid, "id -u") == "0\n"  # the host's own way still serves
    finally:
        rt.kill(sid)
