"""Several runtime roots (several services) on one host: what one claims of the host's
network the next cannot take (an overlap refuses to start, naming the root in the way,
instead of misrouting), each root's egress proxy gets a port of its own and listens on
loopback only, and ``manage.py teardown_root`` removes everything a root put into the host
once its service is gone, keeping the disks of paused sandboxes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import (
    BUILTIN_IMAGE,
    NetworkPolicy,
    ProcessSpec,
    RuntimeUnavailable,
    SandboxSpec,
)
from e2bfacade.runtime.guest import run_process
from e2bfacade.runtime.local import LocalRuntime
from e2bfacade.runtime.local.net.network import digest_of, load_config
from e2bfacade.runtime.local.net.rules import NetworkConfig
from tests.network.conftest import (
    REPO,
    curl,
    network_config,
    start_egress,
    unique_cidr,
    unique_port,
)
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.runtime.helpers import any_daemon_pids
from tests.support.internet import TestInternet
from tests.support.live_server import listening

DOMAINS = NetworkPolicy(
    allow_internet=True, allow_out=("allowed.example",), deny_out=("0.0.0.0/0",)
)


def _rules() -> list[str]:
    out = subprocess.run(["ip", "rule", "show"], capture_output=True, text=True, timeout=10)
    return out.stdout.splitlines()


def _tables() -> str:
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=10)
    return out.stdout


def _routes_of(table: str) -> str:
    out = subprocess.run(
        ["ip", "route", "show", "table", table], capture_output=True, text=True, timeout=10
    )
    return out.stdout.strip()


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root)
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def _loops_under(root: Path) -> list[str]:
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().startswith(f"{root}/"):
                found.append(backing.parent.parent.name)
    return found


def _forget(rt: LocalRuntime) -> None:
    """Best effort, for a test that failed half-way: nothing of ``rt`` left on the host."""
    with contextlib.suppress(Exception):
        destroy_runtime(rt)
    if rt.network is not None:
        with contextlib.suppress(Exception):
            rt.network.teardown()
    shutil.rmtree(rt.root, ignore_errors=True)


@pytest.fixture
def roots_made() -> Iterator[list[LocalRuntime]]:
    made: list[LocalRuntime] = []
    yield made
    for rt in made:
        _forget(rt)


def test_a_root_whose_range_another_root_holds_refuses_to_start_naming_it(
    net_runtime: LocalRuntime, make_sandbox: Callable[..., str], roots_made: list[LocalRuntime]
) -> None:
    first = net_runtime.network
    assert first is not None
    # The same range, as two services left at SANDBOX_NETWORK_CIDR's default have.
    same = dataclasses.replace(first.config, proxy_port=unique_port())
    cidr = first.config.cidr
    rules_before = [line for line in _rules() if cidr in line]
    root = Path(tempfile.mkdtemp(prefix="e2bt-", dir="/tmp"))
    try:
        with pytest.raises(RuntimeUnavailable) as refused:
            roots_made.append(LocalRuntime(root, network=same))
    finally:
        if not roots_made:
            shutil.rmtree(root, ignore_errors=True)
    assert str(net_runtime.root) in refused.value.message
    assert "SANDBOX_NETWORK_CIDR" in refused.value.message
    # Nothing of the second root reached the kernel, so nothing of the first one's moved.
    assert [line for line in _rules() if cidr in line] == rules_before
    assert f"e2bfacade_{digest_of(root)[:8]}" not in _tables()
    sid = make_sandbox(allow_internet=True)
    assert curl(net_runtime, sid, "http://203.0.113.10/")[0] == 0


def test_a_refused_network_configuration_is_not_kept_as_the_roots_own(
    net_runtime: LocalRuntime, roots_made: list[LocalRuntime]
) -> None:
    first = net_runtime.network
    assert first is not None
    refused_config = dataclasses.replace(first.config, proxy_port=unique_port())
    root = Path(tempfile.mkdtemp(prefix="e2bt-", dir="/tmp"))
    try:
        with pytest.raises(RuntimeUnavailable):
            roots_made.append(LocalRuntime(root, network=refused_config))
        # A restart as last configured (no configuration given, as the egress proxy and
        # teardown_root do) finds none, so sets up no networking and meets no overlap.
        restarted = LocalRuntime(root, spares=0)
        roots_made.append(restarted)
        assert load_config(restarted.layout) is None
        assert restarted.network is None
        # Corrected, the root starts, and that configuration is the one kept.
        corrected = dataclasses.replace(refused_config, cidr=unique_cidr())
        fixed = LocalRuntime(root, spares=0, network=corrected)
        roots_made.append(fixed)
        assert fixed.network is not None
        assert load_config(fixed.layout) == corrected
    finally:
        if not roots_made:
            shutil.rmtree(root, ignore_errors=True)


def test_two_roots_run_side_by_side_each_with_its_own_egress_proxy_on_loopback(
    internet: TestInternet, roots_made: list[LocalRuntime]
) -> None:
    proxies: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(2):
            # No port given: each root's is chosen when it is registered.
            config = NetworkConfig(
                uplink=internet.uplink,
                gateway=internet.gateway,
                cidr=unique_cidr(),
                dns_servers=("8.8.8.8",),
            )
            rt = make_runtime(network=config)
            roots_made.append(rt)
            rt.ensure_base_image()
            proxies.append(start_egress(rt.root))
        for proxy, rt in zip(proxies, roots_made, strict=True):
            assert proxy.poll() is None, (rt.root / "egress.log").read_text()
        bound = [listening(proxy.pid) for proxy in proxies]
        assert all(len(b) == 1 and b[0][0] == "127.0.0.1" for b in bound), bound
        assert bound[0][0][1] != bound[1][0][1], bound
        for rt in roots_made:
            sid = f"r{secrets.token_hex(6)}"
            rt.create(SandboxSpec(sid, BUILTIN_IMAGE, network=DOMAINS))
            code, body = curl(rt, sid, "http://allowed.example/")
            assert code == 0 and "203.0.113.10" in body, body
            assert curl(rt, sid, "http://denied.example/")[0] != 0
            rt.kill(sid)
    finally:
        for proxy in proxies:
            proxy.kill()
            proxy.wait()


def _teardown(root: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SANDBOX_ROOT": str(root),
        "SANDBOX_UPLINK": "none",  # the root's own saved configuration is what counts
        "DATABASE_URL": f"sqlite:///{root}/unused.sqlite3",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_SETTINGS_MODULE": "e2bfacade.settings",
    }
    return subprocess.run(
        [sys.executable, "manage.py", "teardown_root", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_teardown_root_removes_what_a_gone_service_left_and_keeps_paused_disks(
    internet: TestInternet, roots_made: list[LocalRuntime]
) -> None:
    config = network_config(internet)
    rt = make_runtime(network=config)
    roots_made.append(rt)
    rt.ensure_base_image()
    network = rt.network
    assert network is not None
    root, table, cidr, mark = rt.root, network.table, config.cidr, hex(network.mark)
    running, paused = f"r{secrets.token_hex(6)}", f"p{secrets.token_hex(6)}"
    rt.create(SandboxSpec(running, BUILTIN_IMAGE, network=NetworkPolicy(allow_internet=True)))
    rt.create(SandboxSpec(paused, BUILTIN_IMAGE, network=DOMAINS))
    note = secrets.token_hex(8)
    wrote = run_process(
        rt.guest(paused),
        ProcessSpec(argv=("/bin/sh", "-ec", f"echo {note} > /root/note; sync"), user="root"),
    )
    assert wrote.exit_code == 0
    rt.pause(paused)
    ours = [line for line in _rules() if cidr in line or mark in line]
    route_tables = {line.split("lookup")[1].split()[0] for line in ours if "lookup" in line}
    route_tables.discard("main")
    assert ours and route_tables and table in _tables()
    # The service is gone (its processes ended); the sandboxes and the kernel state stay.

    refused = _teardown(root)
    assert refused.returncode != 0
    assert running in refused.stderr and paused in refused.stderr, refused.stderr
    assert table in _tables() and rt.status(running).state == "running"

    done = _teardown(root, "--kill")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line for line in _rules() if cidr in line or mark in line] == []
    assert table not in _tables()
    assert all(_routes_of(t) == "" for t in route_tables), route_tables
    assert _mounts_under(root) == [] and _loops_under(root) == []
    assert any_daemon_pids(root) == []
    parents = [*getattr(rt.cgroups, "roots", {}).values(), getattr(rt.cgroups, "root", None)]
    assert not any(p is not None and p.exists() for p in parents), parents
    assert not (root / "sandboxes" / running).exists()
    assert not (root / "sandboxes" / paused).exists()
    assert (root / "images").is_dir()  # templates and snapshots are not the teardown's
    kept = root / "kept" / paused / "disk.img"
    assert str(kept) in done.stdout, done.stdout
    assert (kept.parent / "sandbox.json").is_file()
    # Given up: no later process of the root sets its network up again by itself.
    assert not (root / "run" / "network.json").exists()
    # The paused sandbox's files are all there, in its kept disk.
    with tempfile.TemporaryDirectory() as mount_point:
        subprocess.run(
            ["mount", "-o", "loop,ro", str(kept), mount_point],
            check=True,
            capture_output=True,
            timeout=30,
        )
        try:
            assert (Path(mount_point) / "upper" / "root" / "note").read_text().strip() == note
        finally:
            subprocess.run(["umount", mount_point], check=True, timeout=30)
    # Its range is free again: another root may take it.
    after = Path(tempfile.mkdtemp(prefix="e2bt-", dir="/tmp"))
    roots_made.append(LocalRuntime(after, network=config))
    # And a second teardown finds nothing to do.
    again = _teardown(root)
    assert again.returncode == 0, again.stdout + again.stderr


def test_the_egress_port_is_auto_or_a_port(tmp_path: Path) -> None:
    """``SANDBOX_EGRESS_PORT`` is validated at start, naming the variable."""
    for value, ok in (("auto", True), ("49991", True), ("0", False), ("http", False)):
        env = {
            **os.environ,
            "SANDBOX_UPLINK": "lo",
            "SANDBOX_EGRESS_PORT": value,
            "DATABASE_URL": f"sqlite:///{tmp_path}/unused.sqlite3",
            "DJANGO_SETTINGS_MODULE": "e2bfacade.settings",
        }
        result = subprocess.run(
            [sys.executable, "-c", "import django; django.setup()"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (result.returncode == 0) is ok, (value, result.stderr[-500:])
        if not ok:
            assert "SANDBOX_EGRESS_PORT" in result.stderr.strip().splitlines()[-1]
