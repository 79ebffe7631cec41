"""The gvisor driver on the root's network (its sandboxes' links are the local driver's
slots, with the same nftables rules and NAT; gVisor's own network stack answers in the
guest): egress through the test internet, the rules, a live update, and a pause (a
checkpoint) of a sandbox holding an open connection out, which gVisor resets."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from e2bfacade.runtime.base import BUILTIN_IMAGE, NetworkPolicy, PauseMode, SandboxSpec
from e2bfacade.runtime.local import HostRuntime
from tests.network.conftest import curl, network_config, sh
from tests.network.test_egress import OTHER, WEB, served_by
from tests.runtime.conftest import destroy_runtime, make_gvisor_runtime
from tests.support.internet import TestInternet


@pytest.fixture(scope="module")
def gv_net(internet: TestInternet) -> Iterator[HostRuntime]:
    rt = make_gvisor_runtime(network=network_config(internet))
    rt.ensure_base_image()
    yield rt
    destroy_runtime(rt)
    assert rt.network is not None
    rt.network.teardown()


def make(rt: HostRuntime, **policy: object) -> str:
    sid = f"v{uuid.uuid4().hex[:12]}"
    rt.create(SandboxSpec(sid, BUILTIN_IMAGE, network=NetworkPolicy(**policy)))  # type: ignore[arg-type]
    return sid


def test_a_gvisor_sandbox_reaches_the_internet_by_its_rules(gv_net: HostRuntime) -> None:
    sid = make(gv_net, allow_internet=True)
    closed = make(gv_net, allow_internet=False)
    only = make(gv_net, allow_internet=True, deny_out=("0.0.0.0/0",), allow_out=(OTHER,))
    try:
        code, body = curl(gv_net, sid, f"http://{WEB}/")
        assert code == 0 and served_by(body) == WEB, body
        assert curl(gv_net, closed, f"http://{WEB}/")[0] != 0
        assert curl(gv_net, only, f"http://{WEB}/")[0] != 0
        code, body = curl(gv_net, only, f"http://{OTHER}/")
        assert code == 0 and served_by(body) == OTHER, body
        gv_net.update_network(only, NetworkPolicy(allow_internet=True))
        assert curl(gv_net, only, f"http://{WEB}/")[0] == 0
    finally:
        for s in (sid, closed, only):
            gv_net.kill(s)


def test_a_pause_resets_the_guests_open_connection_out_and_succeeds(
    gv_net: HostRuntime,
) -> None:
    sid = make(gv_net, allow_internet=True)
    try:
        hold = (
            "import socket, time\n"
            f"s = socket.create_connection(({WEB!r}, 80), timeout=5)\n"
            "open('/tmp/connected', 'w').write('1')\n"
            "time.sleep(3600)\n"
        )
        sh(gv_net, sid, f'python3 -c "{hold}" >/dev/null 2>&1 & sleep 2; cat /tmp/connected')
        gv_net.pause(sid)
        assert gv_net.status(sid).pause_mode is PauseMode.FULL
        gv_net.resume(sid)
        code, body = curl(gv_net, sid, f"http://{WEB}/")
        assert code == 0 and served_by(body) == WEB, body
    finally:
        gv_net.kill(sid)
