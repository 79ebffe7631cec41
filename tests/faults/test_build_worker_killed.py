"""A template build whose build worker dies mid-step. ``manage.py run_worker`` (whose threads
run builds) is SIGKILLed while a RUN step sleeps in the build sandbox; a worker started
again takes the build over once its lease runs out, kills what the dead attempt left in the
runtime and re-drives it: the build ends ``ready`` once, its log says it resumed, no build
sandbox is left and a sandbox of the template has every step's files. A build whose worker
dies in every one of its MAX_ATTEMPTS attempts ends ``error`` with the reason, never
``ready``. A power cut (every process of the service and of its runtime, the build
sandbox's too, and no disk mounted) mid-build is survived the same way.

Each case has its own deployment, with a short lease so that a takeover is quick."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, Template

from templates.builds.worker import MAX_ATTEMPTS
from tests.support.live_fixtures import point_sdk
from tests.support.live_process import REPO, WORKER_INTERVAL
from tests.support.live_server import Deployment, Server
from tests.support.runtime_support import power_cut
from tests.support.waiting import eventually

LEASE_SECONDS = 3
STEP_SECONDS = 8
# A lease to run out, a sandbox to start, the step again, the finalize: on a loaded 2-core
# host well under a minute.
FINISH_SECONDS = 120
RUNNING_SECONDS = 60


@pytest.fixture
def deployment(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Deployment, Server]]:
    env = {"TEMPLATE_BUILD_LEASE_SECONDS": str(LEASE_SECONDS)}
    with Deployment(teams=1, prefix="e2bk", extra_env=env) as dep:
        server = dep.server(lifecycle_worker=True)
        point_sdk(monkeypatch, server, dep.take_team().api_key)
        yield dep, server


# ------------------------------------------------------------------------------ helpers
def pids_running(marker: str) -> list[int]:
    """The processes (on the host, so in every sandbox too) whose command line holds
    ``marker``: the build step's shell while it runs."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def kill_worker(server: Server) -> None:
    """SIGKILL ``run_worker`` (its session: its build threads die with it) as an OOM kill
    would; the build sandbox it drove keeps running (the runtime's launcher is apart)."""
    assert server.worker is not None and server.worker.poll() is None
    os.killpg(server.worker.pid, signal.SIGKILL)
    server.worker.wait(timeout=10)


def start_worker(server: Server) -> None:
    """A new ``run_worker`` beside the running API, as its supervisor would restart it
    (``server.stop`` stops it)."""
    with open(server.log_path, "ab") as log:
        server.worker = subprocess.Popen(
            [sys.executable, "manage.py", "run_worker", "--interval", str(WORKER_INTERVAL)],
            cwd=REPO,
            env=server.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def build_row(dep: Deployment, build_id: str) -> tuple[str, int, object]:
    rows = dep.query(
        "SELECT status, attempts, reason FROM templates_templatebuild WHERE build_id = %s",
        (uuid.UUID(build_id).hex if not dep.postgres else build_id,),
    )
    assert len(rows) == 1, rows
    status, attempts, reason = rows[0]
    return str(status), int(attempts), reason


def log_of(dep: Deployment, build_id: str) -> list[str]:
    rows = dep.query(
        "SELECT message FROM templates_buildlogentry WHERE build_id = %s ORDER BY seq",
        (uuid.UUID(build_id).hex if not dep.postgres else build_id,),
    )
    return [str(r[0]) for r in rows]


def build_sandboxes(dep: Deployment) -> set[str]:
    return {i for i in dep.runtime_ids() if i.startswith("b-")}


def start_build(marker: str, name: str, seconds: int) -> tuple[str, str]:
    """Start a build whose second RUN sleeps ``seconds`` (``marker`` names its shell)."""
    template = (
        Template()
        .from_template("base")
        .run_cmd("echo one > /home/user/one.txt")
        .run_cmd(f": {marker}; sleep {seconds}; echo two > /home/user/two.txt")
        .set_envs({"AFTER": "the-sleep"})
    )
    info = Template.build_in_background(template, name, cpu_count=1, memory_mb=1024)
    return info.template_id, info.build_id


def wait_step_running(
    dep: Deployment, build_id: str, marker: str, attempt: int, before: frozenset[int] = frozenset()
) -> frozenset[int]:
    """Wait until attempt ``attempt`` runs the sleeping step: its own shell, not the one a
    killed attempt left running in the runtime (``before``) until the next one kills it."""

    def running() -> bool:
        status, attempts, _ = build_row(dep, build_id)
        assert status == "building", (status, log_of(dep, build_id))
        pids = set(pids_running(marker))
        return attempts == attempt and bool(pids) and not pids & before

    eventually(running, within=RUNNING_SECONDS, every=0.1, what=f"attempt {attempt}'s sleep")
    return frozenset(pids_running(marker))


def wait_finished(dep: Deployment, build_id: str) -> str:
    status, _, _ = eventually(
        lambda: build_row(dep, build_id),
        until=lambda row: row[0] in ("ready", "error"),
        within=FINISH_SECONDS,
        every=0.1,
        what="the build to finish",
    )
    return status


def check_sandbox_of(name: str) -> None:
    sandbox = Sandbox.create(name, timeout=120)
    try:
        assert sandbox.files.read("/home/user/one.txt") == "one\n"
        assert sandbox.files.read("/home/user/two.txt") == "two\n"
        assert sandbox.commands.run('echo "$AFTER"').stdout == "the-sleep\n"
    finally:
        sandbox.kill()


def check_nothing_left(dep: Deployment, marker: str) -> None:
    """No build sandbox in the runtime and no process of the step, the dead attempt's
    included (the runtime's kill is by cgroup: give its processes a moment to be reaped)."""
    eventually(
        lambda: build_sandboxes(dep),
        until=lambda left: not left,
        within=15,
        every=0.1,
        what="the build sandbox gone",
    )
    eventually(
        lambda: pids_running(marker),
        until=lambda left: not left,
        within=15,
        every=0.1,
        what="the step's processes gone",
    )


# -------------------------------------------------------------------------------- cases
def test_a_build_whose_worker_is_killed_mid_step_is_redriven_to_ready_once(
    deployment: tuple[Deployment, Server],
) -> None:
    dep, server = deployment
    marker = f"step-{uuid.uuid4().hex[:12]}"
    name = f"killed-{uuid.uuid4().hex[:8]}"
    template_id, build_id = start_build(marker, name, STEP_SECONDS)
    dead_step = wait_step_running(dep, build_id, marker, attempt=1)

    kill_worker(server)
    start_worker(server)

    assert wait_finished(dep, build_id) == "ready", log_of(dep, build_id)
    status, attempts, reason = build_row(dep, build_id)
    assert (status, attempts, reason) == ("ready", 2, None)
    log = log_of(dep, build_id)
    assert any("Resuming the build (attempt 2)" in line for line in log), log
    # The dead attempt's step did not run on beside the re-driven one.
    assert not any(Path(f"/proc/{pid}").exists() for pid in dead_step)
    ready = dep.query(
        "SELECT COUNT(*) FROM templates_templatebuild WHERE template_id = %s AND status = %s",
        (template_id, "ready"),
    )
    assert ready == [(1,)]
    check_nothing_left(dep, marker)
    check_sandbox_of(name)


def test_a_build_interrupted_in_every_attempt_ends_error_never_ready(
    deployment: tuple[Deployment, Server],
) -> None:
    dep, server = deployment
    marker = f"step-{uuid.uuid4().hex[:12]}"
    name = f"doomed-{uuid.uuid4().hex[:8]}"
    template_id, build_id = start_build(marker, name, 300)
    pids: frozenset[int] = frozenset()
    for attempt in range(1, MAX_ATTEMPTS + 1):
        pids = wait_step_running(dep, build_id, marker, attempt=attempt, before=pids)
        kill_worker(server)
        start_worker(server)

    assert wait_finished(dep, build_id) == "error", log_of(dep, build_id)
    _, attempts, reason = build_row(dep, build_id)
    assert attempts == MAX_ATTEMPTS + 1
    # jsonb comes back parsed (PostgreSQL), JSON text as text (SQLite).
    reason = json.loads(reason) if isinstance(reason, str) else reason
    assert isinstance(reason, dict), reason
    assert f"interrupted {MAX_ATTEMPTS} times" in reason["message"], reason
    status_ready = dep.query(
        "SELECT COUNT(*) FROM templates_templatebuild WHERE template_id = %s AND status = %s",
        (template_id, "ready"),
    )
    assert status_ready == [(0,)]
    tags = "SELECT COUNT(*) FROM templates_templatetag WHERE template_id = %s"
    assert dep.query(tags, (template_id,)) == [(0,)]
    check_nothing_left(dep, marker)
    with pytest.raises(Exception, match="not found|no ready build|404"):
        Sandbox.create(name, timeout=60)


def test_a_power_cut_mid_build_is_survived_and_the_build_redriven(
    deployment: tuple[Deployment, Server],
) -> None:
    dep, server = deployment
    marker = f"step-{uuid.uuid4().hex[:12]}"
    name = f"cut-{uuid.uuid4().hex[:8]}"
    _, build_id = start_build(marker, name, STEP_SECONDS)
    wait_step_running(dep, build_id, marker, attempt=1)

    server.kill()
    power_cut(server.sandbox_root)
    assert not pids_running(marker)
    server.start()

    assert wait_finished(dep, build_id) == "ready", log_of(dep, build_id)
    assert build_row(dep, build_id)[1] == 2
    assert any("Resuming the build (attempt 2)" in line for line in log_of(dep, build_id))
    check_nothing_left(dep, marker)
    check_sandbox_of(name)
