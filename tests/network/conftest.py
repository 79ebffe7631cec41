"""Fixtures for the networking tests: the suite's own test internet (tests/support/
internet.py), a local runtime whose uplink it is, and the egress proxy beside it. Nothing
here reaches any network but loopback and the namespaces made here."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import (
    BUILTIN_IMAGE,
    NetworkPolicy,
    ProcessSpec,
    SandboxSpec,
)
from e2bfacade.runtime.guest import run_process
from e2bfacade.runtime.local import HostRuntime, LocalRuntime
from e2bfacade.runtime.local.net.rules import NetworkConfig
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.support.internet import TestInternet
from tests.support.live_server import listening
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
_cidrs = itertools.count((os.getpid() * 13) % 900)


def unique_cidr() -> str:
    """A /18 of 10.0.0.0/8 no other runtime of this run uses."""
    n = next(_cidrs) % 1024
    return f"10.{n // 4}.{(n % 4) * 64}.0/18"


def unique_port() -> int:
    return 40000 + (os.getpid() * 31 + next(_cidrs)) % 9000


# The drivers a live server of these suites runs its sandboxes on (SANDBOX_RUNTIME): the
# egress proxy, its TLS interception and its SOCKS tunnels are the host's, but what reaches
# them comes from a different network stack on each (the kernel's; gVisor's netstack).
LIVE_DRIVERS = ("local", "gvisor")


def live_driver_env(driver: str) -> dict[str, str]:
    """A live server's environment for ``driver``; skips where gVisor's runsc is missing."""
    from e2bfacade.runtime.gvisor.driver import installed

    if driver == "gvisor" and not installed():
        pytest.skip("gvisor: runsc is not installed on this host")
    return {"SANDBOX_RUNTIME": driver}


def assert_runs_on(driver: str, cmdline: str) -> None:
    """``cmdline`` (a guest's /proc/cmdline) is gVisor's exactly when ``driver`` is: the
    server did make its sandboxes with the driver the test names."""
    assert ("gvisor" in cmdline) == (driver == "gvisor"), (driver, cmdline)


@pytest.fixture(scope="session")
def internet() -> Iterator[TestInternet]:
    with TestInternet() as net:
        yield net


def network_config(internet: TestInternet, **extra: object) -> NetworkConfig:
    return NetworkConfig(
        uplink=internet.uplink,
        gateway=internet.gateway,
        cidr=unique_cidr(),
        dns_servers=("8.8.8.8",),
        proxy_port=unique_port(),
        **extra,  # type: ignore[arg-type]
    )


def start_egress(root: Path) -> subprocess.Popen[bytes]:
    """The root's egress proxy, once it listens (it exits at once if it cannot)."""
    proxy = subprocess.Popen(
        [sys.executable, "-m", "e2bfacade.runtime.local.net.egress", str(root)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=open(root / "egress.log", "wb"),  # noqa: SIM115
    )
    eventually(
        lambda: proxy.poll() is not None or listening(proxy.pid),
        within=60,
        what="the egress proxy listening (or exited)",
        ignoring=(OSError,),
    )
    return proxy


@pytest.fixture(scope="module")
def net_runtime(internet: TestInternet) -> Iterator[LocalRuntime]:
    rt = make_runtime(network=network_config(internet))
    rt.ensure_base_image()
    proxy = start_egress(rt.root)
    assert proxy.poll() is None, (rt.root / "egress.log").read_text()
    yield rt
    proxy.kill()
    proxy.wait()
    destroy_runtime(rt)
    assert rt.network is not None
    rt.network.teardown()


@pytest.fixture
def make_sandbox(net_runtime: HostRuntime) -> Iterator[Callable[..., str]]:
    made: list[str] = []

    def make(**network: object) -> str:
        sid = f"n{uuid.uuid4().hex[:12]}"
        made.append(sid)
        policy = NetworkPolicy(**network)  # type: ignore[arg-type]
        net_runtime.create(SandboxSpec(sid, BUILTIN_IMAGE, network=policy))
        return sid

    yield make
    for sid in made:
        net_runtime.kill(sid)


def sh(rt: HostRuntime, sid: str, command: str, user: str = "root") -> tuple[int, str]:
    result = run_process(
        rt.guest(sid), ProcessSpec(argv=("/bin/sh", "-c", command), user=user, timeout=30)
    )
    return result.exit_code, (result.stdout + result.stderr).decode(errors="replace")


def curl(rt: HostRuntime, sid: str, url: str, *extra: str) -> tuple[int, str]:
    """``curl`` in the guest: (exit code, body). Refused connections fail at once."""
    args = " ".join(extra)
    return sh(rt, sid, f"curl -sS --connect-timeout 3 --max-time 8 {args} {url}")
