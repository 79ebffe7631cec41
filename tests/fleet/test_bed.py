"""Several hosts as one service, on the test bed a user tries a fleet with
(``scripts/fleet.sh``: three hosts in namespaces, an etcd member each, the fleet's
PostgreSQL over TCP, HAProxy in front), driven by the unmodified E2B SDK through the front.

One bed for the module (its start is ~30 s of the suite); the test that kills a host runs
last, and the bed's ``down`` must leave nothing behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from e2b import Sandbox

from e2bfacade.fleet.haproxy import Front
from nodes.selectors import host_label
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test bed makes namespaces")


def fleet(bed: dict[str, str], *args: str, timeout: float = 180) -> str:
    proc = subprocess.run(
        ["bash", "scripts/fleet.sh", *args],
        cwd=REPO,
        env={**os.environ, "FLEET_DIR": bed["dir"]},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"fleet.sh {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def bed() -> Iterator[dict[str, str]]:
    state = {"dir": f"/tmp/e2bfleet-{uuid.uuid4().hex[:8]}"}
    try:
        out = fleet(state, "up", "3")
        state.update(re.findall(r"^export (\w+)=(\S+)$", out, re.M))
        state["database"] = "postgresql://postgres@{}/e2bfacade".format(
            re.search(r"^database\s+(\S+)", fleet(state, "status"), re.M)[1]  # type: ignore[index]
        )
        yield state
    finally:
        subprocess.run(
            ["bash", "scripts/fleet.sh", "down"],
            cwd=REPO,
            env={**os.environ, "FLEET_DIR": state["dir"]},
            timeout=180,
        )
    # Nothing of the bed outlives it: its directory, mounts, namespaces, processes.
    assert not Path(state["dir"]).exists()
    assert state["dir"] not in Path("/proc/self/mountinfo").read_text()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert state["dir"] not in ps
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert state["dir"] not in loops


@pytest.fixture
def sdk(bed: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
        monkeypatch.setenv(name, bed[name])
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    return bed


def holders(bed: dict[str, str]) -> dict[str, str]:
    """sandbox id -> the host (a, b, c) its row names."""
    with psycopg.connect(bed["database"]) as conn:
        rows = conn.execute("SELECT sandbox_id, host FROM sandboxes_sandbox").fetchall()
    return {sid: host.rstrip("/").split("/")[-2] for sid, host in rows if host}


def test_creates_spread_over_the_hosts_and_every_call_reaches_its_holder(
    sdk: dict[str, str],
) -> None:
    sandboxes = [Sandbox.create(timeout=120) for _ in range(6)]
    try:
        for i, sandbox in enumerate(sandboxes):
            assert sandbox.commands.run(f"echo {i}").stdout.strip() == str(i)
            sandbox.files.write("/tmp/note", f"note {i}")
            assert sandbox.files.read("/tmp/note") == f"note {i}"
            assert sandbox.is_running()
            sandbox.set_timeout(200)
        on = holders(sdk)
        spread = {h: sum(on[s.sandbox_id] == h for s in sandboxes) for h in "abc"}
        # The front's default is round robin over the ready hosts.
        assert all(n >= 1 for n in spread.values()), spread
        paginator = Sandbox.list()
        listed: set[str] = set()
        while paginator.has_next:
            listed |= {s.sandbox_id for s in paginator.next_items()}
        assert {s.sandbox_id for s in sandboxes} <= listed
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
    # Killed sandboxes leave the front's map.
    eventually(
        lambda: Path(sdk["dir"], "sandboxes.map").read_text(),
        within=10,
        what="the map to forget the killed sandboxes",
        until=lambda text: not any(s.sandbox_id in text for s in sandboxes),
    )


def test_one_idempotency_key_sent_to_every_host_at_once_makes_one_sandbox(
    sdk: dict[str, str],
) -> None:
    key = f"storm-{uuid.uuid4().hex}"
    answers: list[tuple[int, str]] = []

    def create() -> None:
        r = httpx.post(
            sdk["E2B_API_URL"] + "/sandboxes",
            headers={"X-API-Key": sdk["E2B_API_KEY"], "Idempotency-Key": key},
            json={"templateID": "base", "timeout": 60},
            timeout=60,
        )
        answers.append((r.status_code, r.json().get("sandboxID", r.text)))

    threads = [threading.Thread(target=create) for _ in range(9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    created = {sid for status, sid in answers if status == 201}
    # Every answer is the one sandbox (a 409 "in progress" is the documented answer to a
    # retry that arrives while the first is still creating).
    assert len(created) == 1, answers
    assert all(status in (201, 409) for status, _ in answers), answers
    (sandbox_id,) = created
    with psycopg.connect(sdk["database"]) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM sandboxes_sandbox WHERE state <> 'killed' AND sandbox_id = %s",
            [sandbox_id],
        ).fetchone() or (0,)
    assert count == 1
    Sandbox.connect(sandbox_id).kill()


def test_a_draining_host_gets_no_creates_and_keeps_serving_its_own_sandboxes(
    sdk: dict[str, str],
) -> None:
    admin = {"X-Admin-Token": sdk["E2BFACADE_ADMIN_TOKEN"]}
    api = sdk["E2B_API_URL"]
    before = [Sandbox.create(timeout=200) for _ in range(3)]
    on = holders(sdk)
    (kept,) = [s for s in before if on[s.sandbox_id] == "b"]
    b_label = host_label(host_ids(sdk)["b"])
    nodes = httpx.get(f"{api}/nodes", headers=admin, timeout=10).json()
    assert {n["status"] for n in nodes} == {"ready"} and len(nodes) == 3, nodes
    drained = httpx.post(f"{api}/nodes/{b_label}", headers=admin, json={"status": "draining"})
    assert drained.status_code == 204, drained.text
    # Within a third of a lease its member applies it, and within two health checks the
    # front stops sending it creates.
    eventually(
        lambda: httpx.get(f"{api}/nodes/{b_label}", headers=admin, timeout=10).json()["status"],
        within=10,
        what="host b to be draining",
        until=lambda status: status == "draining",
    )
    # The front's checks of /health/placement take b out of where creates go.
    eventually(
        lambda: front_status(sdk, "any-api", "b"),
        within=10,
        what="the front to send host b no creates",
        until=lambda status: status.startswith("DOWN"),
    )
    after: list[Sandbox] = []
    try:
        for _ in range(6):
            after.append(Sandbox.create(timeout=60))
        placed = holders(sdk)
        assert all(placed[s.sandbox_id] != "b" for s in after), placed
        assert kept.commands.run("echo still").stdout.strip() == "still"
    finally:
        httpx.post(f"{api}/nodes/{b_label}", headers=admin, json={"status": "ready"})
        for sandbox in before + after:
            sandbox.kill()
    eventually(
        lambda: front_status(sdk, "any-api", "b"),
        within=15,
        what="the front to send host b creates again",
        until=lambda status: status.startswith("UP"),
    )


def front_status(bed: dict[str, str], backend: str, server: str) -> str:
    """What HAProxy's health checks say of ``server`` in ``backend`` (UP, DOWN, …)."""
    front = Front(Path(bed["dir"], "haproxy.sock"), Path(bed["dir"], "sandboxes.map"))
    for line in front.command("show stat\n").splitlines():
        fields = line.split(",")
        if fields[:2] == [backend, server]:
            return fields[17]
    return "absent"


def host_ids(bed: dict[str, str]) -> dict[str, str]:
    """host (a, b, c) -> its runtime's host id."""
    return {
        name: Path(bed["dir"], "hosts", name, "root", "host-id").read_text().strip()
        for name in "abc"
    }


def fence_of(bed: dict[str, str], host: str) -> dict[str, float]:
    path = Path(bed["dir"], "hosts", host, "root", "fleet", "serving")
    return dict(json.loads(path.read_text()))


def test_a_restarted_host_keeps_its_sandboxes_running_and_its_incarnation(
    sdk: dict[str, str],
) -> None:
    sandboxes = [Sandbox.create(timeout=200) for _ in range(3)]
    on = holders(sdk)
    host = on[sandboxes[0].sandbox_id]
    mine = [s for s in sandboxes if on[s.sandbox_id] == host]
    for sandbox in mine:
        sandbox.commands.run("sleep 600", background=True)
    incarnation = fence_of(sdk, host)["incarnation"]
    fleet(sdk, "restart", host)
    for sandbox in mine:
        # The same processes, not a new boot: the sleep started before the restart.
        assert sandbox.commands.run("pgrep -c -x sleep").stdout.strip() == "1"
    assert fence_of(sdk, host)["incarnation"] == incarnation
    for sandbox in sandboxes:
        sandbox.kill()


def test_a_partitioned_host_is_answered_unreachable_fences_itself_and_serves_again_healed(
    sdk: dict[str, str],
) -> None:
    sandboxes = [Sandbox.create(timeout=200) for _ in range(3)]
    on = holders(sdk)
    host = on[sandboxes[0].sandbox_id]
    cut = sandboxes[0]
    others = [s for s in sandboxes if on[s.sandbox_id] != host]
    fleet(sdk, "partition", host)
    try:
        started = time.monotonic()
        answer = eventually(
            lambda: httpx.get(
                f"{sdk['E2B_API_URL']}/sandboxes/{cut.sandbox_id}",
                headers={"X-API-Key": sdk["E2B_API_KEY"]},
                timeout=5,
            ),
            within=10,
            what="a 503 host_unreachable for the cut host's sandbox",
            until=lambda r: r.status_code == 503,
            ignoring=(httpx.TransportError,),
        )
        assert time.monotonic() - started <= 10
        assert answer.json()["error_code"] == "host_unreachable"
        # Cut from etcd and the database, the host stops serving by itself: its fence runs
        # out within half a lease of its last renewal.
        eventually(
            lambda: fence_of(sdk, host)["until"] < time.monotonic(),
            within=10,
            what="the cut host's fence to fall",
        )
        for sandbox in others:
            assert sandbox.commands.run("echo alive").stdout.strip() == "alive"
    finally:
        fleet(sdk, "heal", host)
    # Both of its backends back in the front (their checks are apart), then its sandbox.
    label = host_label(host_ids(sdk)[host])
    eventually(
        lambda: [front_status(sdk, f"{label}-{plane}", host) for plane in ("api", "sandbox")],
        within=30,
        what="the front to find both of the host's backends up again",
        until=lambda states: all(state.startswith("UP") for state in states),
    )
    eventually(
        lambda: cut.commands.run("echo back").stdout.strip(),
        within=30,
        what="the healed host to serve its sandbox again",
        until=lambda out: out == "back",
        ignoring=(Exception,),
    )
    for sandbox in sandboxes:
        sandbox.kill()


def test_a_killed_host_answers_host_unreachable_within_ten_seconds_and_the_others_serve_on(
    sdk: dict[str, str],
) -> None:
    sandboxes = [Sandbox.create(timeout=200) for _ in range(6)]
    on = holders(sdk)
    victim = on[sandboxes[0].sandbox_id]
    victims = [s for s in sandboxes if on[s.sandbox_id] == victim]
    others = [s for s in sandboxes if on[s.sandbox_id] != victim]
    assert others, on
    killed = time.monotonic()
    fleet(sdk, "kill", victim)

    def state_of_victim() -> httpx.Response:
        return httpx.get(
            f"{sdk['E2B_API_URL']}/sandboxes/{victims[0].sandbox_id}",
            headers={"X-API-Key": sdk["E2B_API_KEY"]},
            timeout=5,
        )

    answer = eventually(
        state_of_victim,
        within=10,
        what="a 503 host_unreachable for the dead host's sandbox",
        until=lambda r: r.status_code == 503,
        ignoring=(httpx.TransportError,),
    )
    assert time.monotonic() - killed <= 10
    assert answer.headers["Should-Retry"] == "true"
    assert json.loads(answer.text)["error_code"] == "host_unreachable"
    for sandbox in others:
        assert sandbox.commands.run("echo alive").stdout.strip() == "alive"
        sandbox.kill()
