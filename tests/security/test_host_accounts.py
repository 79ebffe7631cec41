"""Host accounts and the sandboxes' ports: the only way into a sandbox's port is the data
plane's forwarding (which checks the traffic access token, and never leads to the agent),
so no account of the host but the service's may connect to a sandbox's address itself.
Each driver is tried as its sandboxes are addressed: on the root's network (both drivers)
and, for gvisor, on an isolated link (a root without networking). The host's ``nobody``
tries; its attempt is bounded to a few seconds, to the sandbox's own address only."""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from e2bfacade.runtime.base import (
    BUILTIN_IMAGE,
    GuestFileError,
    NetworkPolicy,
    ProcessSpec,
    SandboxSpec,
)
from e2bfacade.runtime.gvisor.driver import GvisorRuntime
from e2bfacade.runtime.local import HostRuntime
from e2bfacade.runtime.local.net.network import digest_of, table_exists
from e2bfacade.runtime.local.net.rules import Link
from e2bfacade.runtime.local.teardown import teardown_root
from tests.network.conftest import internet, network_config  # noqa: F401 - fixture
from tests.runtime.conftest import destroy_runtime, make_gvisor_runtime, make_runtime
from tests.support.internet import TestInternet
from tests.support.waiting import eventually

pytestmark = pytest.mark.sandboxer

PORT = 8000
# Run on the host as another account: connects to argv[1]:argv[2] within 3 s, prints what
# it got ("connected" is the attack succeeding) and how long it took.
PROBE = r"""
import errno, socket, sys, time
start = time.monotonic()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    got = "connected"
except socket.timeout:
    got = "timeout"
except OSError as e:
    got = errno.errorcode.get(e.errno, str(e.errno))
print(got, round(time.monotonic() - start, 2))
"""
# Serves PORT in the guest: answers every connection with "hi".
SERVE = (
    "import socket\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('0.0.0.0', {PORT})); s.listen(8)\n"
    "while True:\n    c, _ = s.accept(); c.sendall(b'hi'); c.close()\n"
)
KINDS = ("local-network", "gvisor-network", "gvisor-isolated")


@pytest.fixture(scope="module", params=KINDS)
def served(request: pytest.FixtureRequest, internet: TestInternet) -> Iterator[HostRuntime]:  # noqa: F811
    """A runtime of the driver and addressing the parameter names."""
    driver, addressing = request.param.split("-")
    config = network_config(internet) if addressing == "network" else None
    make = make_gvisor_runtime if driver == "gvisor" else make_runtime
    rt: HostRuntime = make(network=config)
    rt.ensure_base_image()
    yield rt
    destroy_runtime(rt)
    if rt.network is not None:
        rt.network.teardown()


def link_of(rt: HostRuntime, sandbox_id: str) -> Link:
    if isinstance(rt, GvisorRuntime):
        return rt.sandboxer.link_of(sandbox_id)
    slot = rt.layout.slot_of(sandbox_id)
    assert rt.network is not None and slot is not None
    return rt.network.link(slot)


@pytest.fixture
def serving(served: HostRuntime) -> Iterator[tuple[HostRuntime, str, Link]]:
    """A sandbox serving PORT, once the runtime's port dialer (the data plane's way in)
    reaches it."""
    rt = served
    sid = f"h{uuid.uuid4().hex[:12]}"
    rt.create(SandboxSpec(sid, BUILTIN_IMAGE, network=NetworkPolicy()))
    try:
        rt.guest(sid).start_process(ProcessSpec(("python3", "-c", SERVE), user="user")).close()
        eventually(
            lambda: rt.guest(sid).connect_port(PORT, timeout=1),
            within=20,
            every=0.1,
            what="the guest's server up",
            ignoring=(GuestFileError,),
        ).close()
        yield rt, sid, link_of(rt, sid)
    finally:
        rt.kill(sid)


def connect_as(account: str, address: str, port: int) -> tuple[str, float]:
    """What ``account`` on the host gets connecting to ``address:port``, and in how long."""
    done = subprocess.run(
        ["runuser", "-u", account, "--", "/usr/bin/python3", "-c", PROBE, address, str(port)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd="/",
    )
    got, took = done.stdout.split()
    return got, float(took)


def test_a_host_account_other_than_the_services_cannot_connect_to_a_sandboxs_port(
    serving: tuple[HostRuntime, str, Link],
) -> None:
    rt, sid, link = serving
    got, took = connect_as("nobody", link.guest_ip, PORT)
    # Refused at once (a reset), not left to time out: a client learns at once.
    assert got == "ECONNREFUSED" and took < 2, (got, took)
    # The data plane's way in still reaches the guest's server, as before.
    with rt.guest(sid).connect_port(PORT) as conn:
        conn.settimeout(5)
        assert conn.recv(2) == b"hi"


def test_the_services_own_account_still_connects_to_the_sandboxs_address(
    serving: tuple[HostRuntime, str, Link],
) -> None:
    # The gvisor driver dials its guests' ports and agent this way (its guests are
    # gVisor's network stack, not a namespace of the host's kernel).
    _, _, link = serving
    with socket.create_connection((link.guest_ip, PORT), timeout=5) as conn:
        conn.settimeout(5)
        assert conn.recv(2) == b"hi"


def guard_of(rt: HostRuntime) -> str:
    return f"e2bfacade_{digest_of(rt.root)[:8]}_accounts"


def test_the_guard_goes_with_its_root_and_leaves_other_roots_guarded(
    internet: TestInternet,  # noqa: F811
) -> None:
    kept = make_runtime(network=network_config(internet))
    gone = make_gvisor_runtime()
    try:
        assert table_exists(guard_of(kept)) and table_exists(guard_of(gone))
        report = teardown_root(gone.root, kill=True)
        assert report.left == [] and not table_exists(guard_of(gone)), report
        assert table_exists(guard_of(kept))
    finally:
        for rt in (kept, gone):
            teardown_root(rt.root, kill=True)
            shutil.rmtree(rt.root, ignore_errors=True)
