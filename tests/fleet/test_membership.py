"""A host's membership in a real etcd (Debian's etcd-server, one member on loopback): its
incarnation, a quick restart keeping it, a second claimant refused, and the fence, which
must fall before etcd can delete the host's key, whatever stops the renewals."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd3gw.client import Etcd3Client

from e2bfacade.fleet import membership
from tests.support.live_process import free_port
from tests.support.waiting import eventually

TTL = 3  # the shortest lease the settings allow: the tests wait on it


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[str]:
    if shutil.which("etcd") is None:
        pytest.fail("etcd is not installed: scripts/setup.sh --tests installs etcd-server")
    client, peer = free_port(), free_port()
    proc = subprocess.Popen(
        [
            "etcd", "--name", "t", "--data-dir", str(tmp_path / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"t=http://127.0.0.1:{peer}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{client}"
    try:
        probe = membership.clients([endpoint], 1)[0]
        eventually(probe.status, within=30, what="etcd to answer", ignoring=(Exception,))
        yield endpoint
    finally:
        proc.kill()
        proc.wait()


def advert(name: str = "a") -> membership.Advert:
    return membership.Advert(
        host_id=f"machine:/roots/{name}",
        name=name,
        api_url=f"http://{name}:3000",
        sandbox_url=f"http://{name}:3001",
        state="ready",
        capacity={"cpus": 2},
        labels={},
    )


def member(
    endpoint: str, state_dir: Path, label: str = "aaaa", db_ok: bool = True
) -> membership.Member:
    def database_check() -> None:
        if not db_ok:
            raise ConnectionError("the database does not answer")

    return membership.Member(
        membership.clients([endpoint], 1),
        prefix="/t/",
        label=label,
        advert=advert,
        ttl=TTL,
        state_dir=state_dir,
        database_check=database_check,
    )


def key_exists(endpoint: str) -> bool:
    client: Etcd3Client = membership.clients([endpoint], 1)[0]
    return bool(client.get("/t/hosts/aaaa"))


def test_a_host_registers_with_an_incarnation_and_a_fence_that_runs_half_a_lease(
    etcd: str, tmp_path: Path
) -> None:
    m = member(etcd, tmp_path / "a")
    before = time.monotonic()
    fence = m.beat()
    assert fence is not None and fence.incarnation > 0
    assert before + TTL / 2 <= fence.until <= time.monotonic() + TTL / 2
    assert membership.read_fence(tmp_path / "a") == fence
    [(label, seen, incarnation)] = membership.members(membership.clients([etcd], 1), "/t/")
    assert (label, seen, incarnation) == ("aaaa", advert(), fence.incarnation)


def test_a_quick_restart_keeps_the_incarnation_and_a_second_claimant_is_refused(
    etcd: str, tmp_path: Path
) -> None:
    first = member(etcd, tmp_path / "a").register()
    # The same host started again (its lease id kept in its state directory).
    assert member(etcd, tmp_path / "a").register() == first
    # Another process claiming the same host, without its lease: refused while it lives.
    with pytest.raises(membership.MembershipError, match="held under another lease"):
        member(etcd, tmp_path / "elsewhere").register()


def test_when_renewals_stop_the_fence_falls_before_etcd_deletes_the_key(
    etcd: str, tmp_path: Path
) -> None:
    m = member(etcd, tmp_path / "a")
    assert m.beat() is not None
    # No more beats, as when the member process dies: the fence runs out by itself.
    eventually(
        lambda: not membership.read_fence(tmp_path / "a").holds(),  # type: ignore[union-attr]
        within=TTL,
        what="the fence to run out",
    )
    assert key_exists(etcd), "the key went before the fence fell"
    eventually(lambda: not key_exists(etcd), within=TTL + 5, what="etcd to delete the key")


def test_a_host_that_loses_the_database_or_etcd_does_not_move_its_fence(
    etcd: str, tmp_path: Path
) -> None:
    assert member(etcd, tmp_path / "a").beat() is not None
    fence = membership.read_fence(tmp_path / "a")
    assert member(etcd, tmp_path / "a", db_ok=False).beat() is None
    assert membership.read_fence(tmp_path / "a") == fence
    gone = member("http://127.0.0.1:9", tmp_path / "a")
    assert gone.beat() is None
    assert membership.read_fence(tmp_path / "a") == fence


def test_a_host_whose_lease_lapsed_comes_back_as_a_new_incarnation(
    etcd: str, tmp_path: Path
) -> None:
    m = member(etcd, tmp_path / "a")
    old = m.beat()
    assert old is not None
    eventually(lambda: not key_exists(etcd), within=TTL + 5, what="the lease to lapse")
    new = m.beat()
    assert new is not None and new.incarnation > old.incarnation


def test_a_member_that_stops_answering_costs_one_timeout_not_one_per_call(
    etcd: str, tmp_path: Path
) -> None:
    # A member that takes connections and never answers (a host cut off mid-way): listed
    # first, as another host's own member is on that host.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        dead = f"http://127.0.0.1:{silent.getsockname()[1]}"
        m = membership.Member(
            membership.clients([dead, etcd], 0.5),
            prefix="/t/",
            label="aaaa",
            advert=advert,
            ttl=TTL,
            state_dir=tmp_path / "a",
            database_check=lambda: None,
        )
        assert m.beat() is not None  # the silent one's timeout, once
        started = time.monotonic()
        assert m.beat() is not None
        # A beat makes several calls; each went to the member that answered.
        assert time.monotonic() - started < 0.5
