"""The egress proxy's TLS interception against mitmproxy's, head to head, on this host's
test internet (tests/support/internet.py: a namespace of this machine; no packet leaves
it). What decides whether the proxy keeps its own interception
(e2bfacade/runtime/local/net/tls.py, transform.py) or hands it to mitmproxy.

    sudo .venv/bin/python bench/egress_tls_mitm_bench.py --mitmdump /tmp/mitm-venv/bin/mitmdump
        [--n 200] [--conns 100] [--rounds 2]

**mitmproxy is not a dependency of this project** and never installed by it: give the bench
the ``mitmdump`` of a throwaway virtualenv outside the repository (``python3 -m venv
/tmp/mitm-venv && /tmp/mitm-venv/bin/pip install mitmproxy``), or set ``MITMDUMP``. Without
one the bench says so and exits 2; it prints no figure it did not measure.

The same HTTPS endpoint (``allowed.example``, the test internet's web server, certificate
of its own CA) behind each interceptor, each terminating the guest's TLS with a certificate
it minted, verifying the endpoint against that CA and writing one static header into every
request:

- **ours**: a sandbox whose transform rule names ``allowed.example`` (nftables diverts its
  connection to the runtime's egress proxy, which ends TLS, rewrites and re-encrypts);
- **mitmproxy**: ``mitmdump`` in reverse-proxy mode on ``203.0.113.50:8443`` of the test
  internet (its namespace's ``/etc/hosts`` names ``allowed.example``), with an addon that
  sets the same header; the same sandbox dials it by address, with ``allowed.example`` as
  the TLS server name, and trusts mitmproxy's CA;
- **direct**: a sandbox without domain rules to the endpoint itself (the kernel's path:
  the floor both are measured against).

Measured:

1. **Latency per request once the certificate is cached** (a warm-up request mints it):
   ``--n`` HTTPS GETs per path from inside the sandboxes, on fresh connections (connect,
   handshake, request, read) and on one kept-alive connection, interleaved in 4 rounds;
   p50 and p99, and the interceptor's CPU time per request (its process's utime + stime).
2. **Minting a certificate for a new name**, each in its own process and its own library:
   ``tls.Authority.context`` (ours: a P-256 leaf signed by the P-256 CA, and the
   ``SSLContext`` a connection then uses) and mitmproxy's ``CertStore.get_cert`` (an RSA
   leaf signed by its RSA-2048 CA; the SSL objects are made per connection after it).
3. **Memory per connection**: ``--conns`` TLS connections held through the interceptor,
   first **idle** (handshake done, no request yet), then **active** (one request answered
   on each, kept alive, so both the guest's and the endpoint's side are open), the
   interceptor's RSS sampled every 50 ms; the figure is (median RSS in the phase - RSS
   before) / connections. Each round restarts both interceptors, so neither measures the
   other's leftovers; ``--rounds`` rounds, interleaved.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.egress_bench import REPO, destroy, row  # noqa: E402
from bench.egress_tls_bench import minting  # noqa: E402
from bench.stats import percentile  # noqa: E402
from e2bfacade.runtime.base import (  # noqa: E402
    BUILTIN_IMAGE,
    NetworkPolicy,
    ProcessSpec,
    SandboxSpec,
)
from e2bfacade.runtime.guest import run_process  # noqa: E402
from e2bfacade.runtime.local import LocalRuntime  # noqa: E402
from e2bfacade.runtime.local.net.rules import NetworkConfig  # noqa: E402
from tests.support.internet import TestInternet  # noqa: E402
from tests.support.live_server import free_port, listening  # noqa: E402

HOST, ENDPOINT = "allowed.example", "203.0.113.10"
MITM_ADDRESS, MITM_PORT = "203.0.113.50", 8443
HEADER = ("X-Bench", "static")
TICKS = os.sysconf("SC_CLK_TCK")

# Runs in the guest: argv host, address, port, n, keep (1/0), extra CA (base64 PEM).
LATENCY = r"""
import base64, http.client, json, socket, ssl, sys, time
host, address, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
keep = sys.argv[5] == "1"
context = ssl.create_default_context()  # the sandbox's bundle: the proxy's CA is in it
context.load_verify_locations(cadata=base64.b64decode(sys.argv[6]).decode())  # mitmproxy's

def connect():
    conn = http.client.HTTPSConnection(host, port, timeout=10)
    raw = socket.create_connection((address, port), timeout=10)
    conn.sock = context.wrap_socket(raw, server_hostname=host)
    return conn

took, conn = [], None
for _ in range(n):
    t = time.perf_counter()
    if conn is None or not keep:
        conn = connect()
    conn.request("GET", "/")
    conn.getresponse().read()
    if not keep:
        conn.close()
    took.append((time.perf_counter() - t) * 1000)
print(json.dumps(took))
"""

# Runs in the guest: argv host, address, port, connections, seconds per phase, extra CA.
HOLD = r"""
import base64, http.client, json, socket, ssl, sys, time
host, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
k, hold = int(sys.argv[4]), float(sys.argv[5])
context = ssl.create_default_context()
context.load_verify_locations(cadata=base64.b64decode(sys.argv[6]).decode())
marks = {"start": time.time()}
conns = []
for _ in range(k):
    conn = http.client.HTTPSConnection(host, port, timeout=30)
    conn.sock = context.wrap_socket(
        socket.create_connection((address, port), timeout=30), server_hostname=host)
    conns.append(conn)
marks["idle"] = time.time()
time.sleep(hold)
marks["idle_end"] = time.time()
for conn in conns:
    conn.request("GET", "/")
    conn.getresponse().read()
marks["active"] = time.time()
time.sleep(hold)
marks["active_end"] = time.time()
for conn in conns:
    conn.close()
print(json.dumps(marks))
"""

# Runs in the guest: argv host, address, port, extra CA. One GET of /headers, echoed.
PROBE = r"""
import base64, http.client, socket, ssl, sys
host, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
context = ssl.create_default_context()
context.load_verify_locations(cadata=base64.b64decode(sys.argv[4]).decode())
conn = http.client.HTTPSConnection(host, port, timeout=10)
raw = socket.create_connection((address, port), timeout=10)
conn.sock = context.wrap_socket(raw, server_hostname=host)
conn.request("GET", "/headers")
print(conn.getresponse().read().decode())
"""

# Runs in mitmproxy's own virtualenv: argv confdir, n, prefix. Times CertStore.get_cert.
MITM_MINT = r"""
import json, sys, time
from cryptography import x509
from mitmproxy.certs import CertStore
store = CertStore.from_store(sys.argv[1], "mitmproxy", 2048)
minted, cached = [], []
for i in range(int(sys.argv[2])):
    name = f"{sys.argv[3]}host{i}.example"
    t = time.perf_counter()
    store.get_cert(name, [x509.DNSName(name)])
    minted.append((time.perf_counter() - t) * 1000)
    t = time.perf_counter()
    store.get_cert(name, [x509.DNSName(name)])
    cached.append((time.perf_counter() - t) * 1000)
print(json.dumps([minted, cached]))
"""

ADDON = f"""
def request(flow):
    flow.request.headers[{HEADER[0]!r}] = {HEADER[1]!r}
"""


def start_proxy(root: Path) -> subprocess.Popen[bytes]:
    """The root's egress proxy (ours), once it listens."""
    proxy = subprocess.Popen(
        [sys.executable, "-m", "e2bfacade.runtime.local.net.egress", str(root)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=open(root / "egress.log", "ab"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 60
    while proxy.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if listening(proxy.pid):
                return proxy
        time.sleep(0.05)
    proxy.kill()
    raise RuntimeError((root / "egress.log").read_text())


def find_mitmdump(given: str | None) -> Path | None:
    for candidate in (given, os.environ.get("MITMDUMP"), shutil.which("mitmdump")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


class Mitm:
    """``mitmdump`` in reverse mode on the test internet, in a mount namespace whose
    ``/etc/hosts`` resolves the endpoint's name, verifying it against the internet's CA."""

    def __init__(self, mitmdump: Path, internet: TestInternet, confdir: Path) -> None:
        self.mitmdump, self.internet, self.confdir = mitmdump, internet, confdir
        self.dir = Path(tempfile.mkdtemp(prefix="e2bb-mitm-"))
        (self.dir / "hosts").write_text(f"127.0.0.1 localhost\n{ENDPOINT} {HOST}\n")
        (self.dir / "addon.py").write_text(ADDON)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        argv = (
            f"{self.mitmdump} -q --mode reverse:https://{HOST}:443"
            f" --listen-host {MITM_ADDRESS} --listen-port {MITM_PORT}"
            f" --set confdir={self.confdir}"
            f" --set ssl_verify_upstream_trusted_ca={self.internet.ca_path}"
            f" --set keep_host_header=true -s {self.dir / 'addon.py'}"
        )
        script = f"mount --bind {self.dir}/hosts /etc/hosts && exec {argv}"
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", self.internet.name, "unshare", "-m", "--propagation",
             "private", "sh", "-c", script],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr.log", "wb"),  # noqa: SIM115
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.process.poll() is None:
            probe = subprocess.run(
                ["ip", "netns", "exec", self.internet.name, "ss", "-Hltn",
                 f"src {MITM_ADDRESS}:{MITM_PORT}"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if probe.stdout.strip():
                # ip netns exec, unshare and sh all exec: the pid is mitmdump's own.
                assert "mitmdump" in Path(f"/proc/{self.process.pid}/cmdline").read_text()
                return self.process.pid
            time.sleep(0.1)
        raise RuntimeError((self.dir / "stderr.log").read_text(errors="replace")[-2000:])

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None

    def ca_pem(self) -> str:
        return (self.confdir / "mitmproxy-ca-cert.pem").read_text()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Way:
    """One way from a sandbox to the endpoint, and the interceptor's process (if any)."""

    name: str
    sid: str
    address: str
    port: int
    pid: int | None = None
    fresh: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)
    cpu: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})


def guest(rt: LocalRuntime, sid: str, script: str, *args: str) -> str:
    done = run_process(
        rt.guest(sid), ProcessSpec(argv=("python3", "-c", script, *args), timeout=600)
    )
    if done.exit_code != 0:
        raise RuntimeError(done.stderr.decode(errors="replace")[-2000:])
    return done.stdout.decode()


def latency(rt: LocalRuntime, way: Way, n: int, keep: bool, ca: str) -> None:
    before = cpu_seconds(way.pid) if way.pid else 0.0
    out = guest(rt, way.sid, LATENCY, HOST, way.address, str(way.port), str(n), str(int(keep)), ca)
    if way.pid:
        way.cpu[keep] += cpu_seconds(way.pid) - before
    (way.kept if keep else way.fresh).extend(json.loads(out))


@contextlib.contextmanager
def sampling(pid: int) -> Iterator[list[tuple[float, int]]]:
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                samples.append((time.time(), rss_kib(pid)))
            stop.wait(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def memory(
    rt: LocalRuntime, way: Way, conns: int, ca: str, hold: float
) -> tuple[float, float, int]:
    """KiB per idle and per active connection, and the RSS before (KiB)."""
    assert way.pid is not None
    with sampling(way.pid) as samples:
        time.sleep(0.3)
        out = guest(rt, way.sid, HOLD, HOST, way.address, str(way.port), str(conns), str(hold), ca)
    marks = json.loads(out)
    before = statistics.median(kib for t, kib in samples if t < marks["start"])

    def during(start: str, end: str) -> float:
        # The phase's second half: the connections are all made and the RSS has settled.
        lo = (marks[start] + marks[end]) / 2
        return statistics.median(kib for t, kib in samples if lo <= t <= marks[end])

    idle = (during("idle", "idle_end") - before) / conns
    active = (during("active", "active_end") - before) / conns
    return idle, active, int(before)


def mitm_minting(
    python: Path, confdir: Path, n: int, prefix: str
) -> tuple[list[float], list[float]]:
    """mitmproxy's minting, in its own virtualenv's Python, from its CA in ``confdir``."""
    done = subprocess.run(
        [str(python), "-c", MITM_MINT, str(confdir), str(n), prefix],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    minted: list[float]
    cached: list[float]
    minted, cached = json.loads(done.stdout)
    return minted, cached


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mitmdump", help="mitmproxy's mitmdump (or MITMDUMP)")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--conns", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds per memory phase")
    args = parser.parse_args()
    mitmdump = find_mitmdump(args.mitmdump)
    if mitmdump is None:
        print(
            "mitmproxy is not installed: no figure measured. It is not a dependency of this "
            "project; install it outside the repository (python3 -m venv /tmp/mitm-venv && "
            "/tmp/mitm-venv/bin/pip install mitmproxy) and pass --mitmdump "
            "/tmp/mitm-venv/bin/mitmdump.",
            file=sys.stderr,
        )
        return 2
    mitm_python = mitmdump.parent / "python"
    version = subprocess.run(
        [str(mitmdump), "--version"], capture_output=True, text=True, timeout=60
    ).stdout.splitlines()[0]
    print(f"{version}; ours: e2bfacade/runtime/local/net/tls.py + transform.py")
    with TestInternet() as internet:
        config = NetworkConfig(
            uplink=internet.uplink,
            gateway=internet.gateway,
            cidr="10.198.128.0/18",
            proxy_port=free_port(),
            extra_ca=str(internet.ca_path),
        )
        rt = LocalRuntime(Path(tempfile.mkdtemp(prefix="e2bn-", dir="/tmp")), network=config)
        confdir = Path(tempfile.mkdtemp(prefix="e2bb-mitm-conf-"))
        mitm = Mitm(mitmdump, internet, confdir)
        proxy = None
        subprocess.run(
            ["ip", "-n", internet.name, "addr", "add", f"{MITM_ADDRESS}/32", "dev", "lo"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        try:
            rt.ensure_base_image()
            proxy = start_proxy(rt.root)
            ruled = NetworkPolicy(
                allow_internet=True,
                allow_out=(HOST, MITM_ADDRESS),
                deny_out=("0.0.0.0/0",),
                transforms=((HOST, (HEADER,)),),
            )
            rt.create(SandboxSpec("mitmbenchp", BUILTIN_IMAGE, network=ruled))
            plain = NetworkPolicy(allow_internet=True)
            rt.create(SandboxSpec("mitmbenchd", BUILTIN_IMAGE, network=plain))
            mitm_pid = mitm.start()
            ca = base64.b64encode(mitm.ca_pem().encode()).decode()
            ways = [
                Way("ours: egress proxy, transform rule", "mitmbenchp", ENDPOINT, 443, proxy.pid),
                Way(
                    "mitmproxy: reverse mode + addon",
                    "mitmbenchp",
                    MITM_ADDRESS,
                    MITM_PORT,
                    mitm_pid,
                ),  # fmt: skip
                Way("direct: no interception (floor)", "mitmbenchd", ENDPOINT, 443),
            ]
            # The header arrives through both (the endpoint echoes it on /headers).
            for way in ways[:2]:
                probe = guest(rt, way.sid, PROBE, HOST, way.address, str(way.port), ca)
                assert '["X-Bench", "static"]' in probe, (way.name, probe)
            for keep in (False, True):
                for way in ways:  # warm: certificates minted and cached here, not counted
                    guest(rt, way.sid, LATENCY, HOST, way.address, str(way.port), "5", "1", ca)
                for _ in range(4):
                    for way in ways:
                        latency(rt, way, args.n // 4, keep, ca)
            for keep, label in ((False, "fresh connection each"), (True, "one kept-alive")):
                print(f"HTTPS GET from a sandbox, {label}, {args.n} per path (interleaved)")
                floor = percentile(ways[2].kept if keep else ways[2].fresh, 50)
                for way in ways:
                    values = way.kept if keep else way.fresh
                    extra = percentile(values, 50) - floor
                    per = way.cpu[keep] / len(values) * 1000
                    cpu = f"   CPU {per:.2f} ms/req" if way.pid else ""
                    print(f"{row(way.name, values)}   +{extra:.2f} ms p50 over direct{cpu}")

            print("certificate for a new name, in process, 4 interleaved rounds of 50 names")
            ours_minted: list[float] = []
            ours_cached: list[float] = []
            mitm_minted: list[float] = []
            mitm_cached: list[float] = []
            for r in range(4):
                minted, cached = minting(rt.root, 50, prefix=f"r{r}-")
                ours_minted += minted
                ours_cached += cached
                minted, cached = mitm_minting(mitm_python, confdir, 50, prefix=f"r{r}-")
                mitm_minted += minted
                mitm_cached += cached
            print(row("ours: tls.Authority.context (P-256)", ours_minted))
            print(row("ours: cached", ours_cached))
            print(row("mitmproxy: CertStore.get_cert (RSA 2048)", mitm_minted))
            print(row("mitmproxy: cached", mitm_cached))

            print(f"memory per connection, {args.conns} held, {args.hold:.0f} s a phase")
            for r in range(args.rounds):
                for way in ways[:2]:
                    if way is ways[0]:
                        proxy.kill()
                        proxy.wait()
                        proxy = start_proxy(rt.root)
                        way.pid = proxy.pid
                    else:
                        mitm.stop()
                        way.pid = mitm.start()
                    latency(rt, way, 5, True, ca)  # its certificate minted again
                    idle, active, base = memory(rt, way, args.conns, ca, args.hold)
                    print(
                        f"  round {r + 1} {way.name:<36} RSS before {base / 1024:6.1f} MiB"
                        f"   idle {idle:6.1f} KiB/conn   active {active:6.1f} KiB/conn"
                    )
        finally:
            if proxy is not None:
                proxy.kill()
                proxy.wait()
            mitm.close()
            shutil.rmtree(confdir, ignore_errors=True)
            subprocess.run(
                ["ip", "-n", internet.name, "addr", "del", f"{MITM_ADDRESS}/32", "dev", "lo"],
                capture_output=True, timeout=30,
            )  # fmt: skip
            destroy(rt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
