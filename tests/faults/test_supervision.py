"""``manage.py serve`` supervised as one: whichever of its processes is SIGKILLed (serve
itself, gunicorn's master, nginx's master in front of it, the data plane's master, the
lifecycle worker), nothing of its tree goes on listening on the API's or the data plane's
port (orphans answering there would hold the port against the next start and fool its
readiness probe), serve started again on the same ports comes up and answers, and a
sandbox made before still runs, the same init, reachable. A clean stop (SIGTERM) leaves
none of the runtime's work done ahead (the mounts and loop devices of pooled disks, parked
launchers) and keeps every sandbox. A start on a port still held names its holder, and
takes the port once it is free.

One serve for the module, on one deployment (database and sandbox root), restarted by
each case on the same ports."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from e2bfacade import supervision
from tests.support.live_server import (
    REPO,
    Deployment,
    Server,
    ServerError,
    free_port,
    suite_database_url,
)
from tests.support.waiting import eventually

START_SECONDS = 60
# Generous against what it takes (well under a second: the kernel's parent-death signal,
# then a worker closing its listener); an orphaned gunicorn worker took up to 30 s.
RELEASE_SECONDS = 10
GONE_SECONDS = 40  # every process of the old tree, each having finished what it was doing


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command (state is [0], session [3],
    start time [19]), or None for a process that is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@dataclass(frozen=True)
class Proc:
    pid: int
    start: str  # its start time: a pid the kernel gave to a new process is not this one
    command: str

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[19] == self.start and stat[0] != "Z"


class Serve:
    """``manage.py serve`` on ``deployment``, on two ports kept across restarts."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.root = deployment.sandbox_root
        self.port, self.sandbox_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sandbox_url = f"http://127.0.0.1:{self.sandbox_port}"
        self.log_path = deployment.tmp / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log_from = 0
        self.sessions: list[int] = []  # of every serve started: the cleanup ends theirs

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "serve"]
                + ["--bind", f"127.0.0.1:{self.port}"]
                + ["--sandbox-bind", f"127.0.0.1:{self.sandbox_port}"]
                + ["--workers", "2", "--sandbox-workers", "2", *extra],
                cwd=REPO,
                env=self.deployment.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its session: the service's processes, no helper
            )
        self.sessions.append(self.process.pid)
        return self.process

    def output(self) -> str:
        """What this start of serve (and its children) wrote."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_from)
            return log.read().decode(errors="replace")

    def wait_ready(self) -> None:
        """Until serve says it serves; then whoever listens on the ports is its own."""
        process = self.process
        assert process is not None

        def output() -> str:
            assert process.poll() is None, f"serve exited at start:\n{self.output()}"
            return self.output()

        eventually(
            output, until=lambda out: "[serve] API" in out, within=START_SECONDS, what="serve up"
        )
        holders = eventually(
            lambda: [self.holders(p) for p in (self.port, self.sandbox_port)],
            until=all,
            within=START_SECONDS,
            what="serve listening on both ports",
        )
        ours = supervision.descendants(process.pid)
        assert all(h <= ours for h in holders), (holders, ours)
        # Bounds of a readiness wait, not timed assertions: on a loaded 2-core CI machine a
        # freshly booted worker's first answer took over 10 s.
        assert httpx.get(f"{self.url}/health", timeout=60).status_code == 200
        # No sandbox named: the data plane's 400 says it is up.
        assert httpx.get(f"{self.sandbox_url}/health", timeout=60).status_code == 400

    @staticmethod
    def holders(port: int) -> set[int]:
        return {h.pid for h in supervision.port_holders("127.0.0.1", port)}

    def running(self) -> Serve:
        if self.process is None or self.process.poll() is not None:
            self.start()
            self.wait_ready()
        return self

    def tree(self) -> list[Proc]:
        """serve and every process forked from it in its session (not the runtime's
        helpers, which detach into sessions of their own and outlive the service)."""
        assert self.process is not None
        found = []
        for pid in supervision.descendants(self.process.pid):
            stat = _stat(pid)
            if stat is not None and int(stat[3]) == self.process.pid:
                found.append(Proc(pid, stat[19], _command(pid)))
        return found

    def child(self, role: str) -> Proc:
        """serve's child of ``role``: api (gunicorn's master), front (nginx's master),
        sandboxes (the data plane's master), worker (the lifecycle worker)."""
        assert self.process is not None
        marks = {
            "api": "gunicorn",
            "front": "nginx: master",
            "sandboxes": "sandboxes.dataplane.server",
        }
        mark = marks.get(role, "run_worker")
        children = [
            p for p in self.tree() if (_stat(p.pid) or ["", "0"])[1] == str(self.process.pid)
        ]
        (found,) = [p for p in children if mark in p.command]
        return found

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # the session it was started in
            self.process.wait(timeout=10)

    def kill_leftovers(self) -> None:
        """SIGKILL whatever still runs in the sessions of the serves started here (a test
        that failed may leave some): the service's processes, never the runtime's."""
        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
            stat = _stat(pid)
            if stat is not None and int(stat[3]) in self.sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def wait_released(old: list[Proc], ports: tuple[int, ...]) -> None:
    """Until no process of ``old`` listens on ``ports``, then until all are gone."""
    eventually(
        lambda: [
            (port, p)
            for port in ports
            for h in supervision.port_holders("127.0.0.1", port)
            for p in old
            if p.pid == h.pid and p.alive()
        ],
        until=lambda holding: not holding,
        within=RELEASE_SECONDS,
        what="the old processes off the ports",
    )
    eventually(
        lambda: [p for p in old if p.alive()],
        until=lambda left: not left,
        within=GONE_SECONDS,
        what="the old processes gone",
    )


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    with Deployment(teams=1, prefix="e2bsup", suite_url=suite_database_url()) as made:
        yield made


@pytest.fixture(scope="module")
def service(deployment: Deployment) -> Iterator[Serve]:
    serve = Serve(deployment)
    try:
        yield serve
    finally:
        serve.stop()
        serve.kill_leftovers()


@pytest.fixture(scope="module")
def sdk(service: Serve, deployment: Deployment) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("E2B_API_URL", service.url)
        patch.setenv("E2B_SANDBOX_URL", service.sandbox_url)
        patch.setenv("E2B_API_KEY", deployment.take_team().api_key)
        yield


@dataclass(frozen=True)
class Kept:
    sandbox_id: str
    init_pid: int


@pytest.fixture(scope="module")
def kept(service: Serve, deployment: Deployment, sdk: None) -> Kept:
    """A sandbox made before any kill, with a file in it."""
    service.running()
    sbx = Sandbox.create(timeout=600)
    sbx.files.write("/home/user/kept", "made before")
    return Kept(sbx.sandbox_id, deployment.runtime().status(sbx.sandbox_id).init_pid)


def assert_kept(deployment: Deployment, kept: Kept) -> None:
    info = deployment.runtime().status(kept.sandbox_id)
    assert (str(info.state), info.init_pid) == ("running", kept.init_pid)


def assert_reachable(kept: Kept) -> None:
    sbx = Sandbox.connect(kept.sandbox_id)
    assert sbx.files.read("/home/user/kept") == "made before"
    assert sbx.commands.run("echo after").stdout == "after\n"


# --------------------------------------------------------------------------------- kills
@pytest.mark.parametrize("role", ["serve", "api", "front", "sandboxes", "worker"])
def test_a_sigkilled_process_takes_its_tree_off_the_ports_and_serve_restarts_on_them(
    service: Serve, deployment: Deployment, kept: Kept, role: str
) -> None:
    service.running()
    assert service.process is not None
    old = service.tree()
    victim = service.process.pid if role == "serve" else service.child(role).pid

    os.kill(victim, signal.SIGKILL)

    # Its children stop the rest (or, serve killed, the kernel tells them): serve exits.
    assert service.process.wait(timeout=GONE_SECONDS) != 0
    wait_released(old, (service.port, service.sandbox_port))
    assert_kept(deployment, kept)
    service.start()
    service.wait_ready()
    assert {p.pid for p in old} & {p.pid for p in service.tree()} == set()
    assert_kept(deployment, kept)
    assert_reachable(kept)


# ---------------------------------------------------------------------------- clean stop
def pooled(root: Path) -> dict[str, list[str]]:
    """What the runtime's pools hold of the host for ``root``: mounts and loop devices of
    pooled disks, parked launchers."""
    pool = f"{root}/pool/"
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(pool)
    ]
    loops = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().startswith(pool):
                loops.append(backing.parent.parent.name)
    spares = [
        str(pid)
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if f"{root}/run/sandboxd-spares/" in _command(pid)
    ]
    return {"mounts": sorted(mounts), "loops": sorted(loops), "spares": sorted(spares)}


def test_a_clean_stop_leaves_no_pooled_disk_or_spare_launcher_and_keeps_the_sandboxes(
    service: Serve, deployment: Deployment, kept: Kept
) -> None:
    service.running()
    assert service.process is not None
    # The pools fill in the background (the lifecycle worker's sweep, after each create).
    spares_used = deployment.runtime().spares.target > 0  # cgroup v1 only
    held = eventually(
        lambda: pooled(service.root),
        until=lambda held: held["mounts"] and (held["spares"] or not spares_used),
        within=30,
        every=0.1,
        what="the pools filled",
    )
    assert held["loops"]
    old = service.tree()

    service.process.send_signal(signal.SIGTERM)

    assert service.process.wait(timeout=GONE_SECONDS) == 0, service.output()
    wait_released(old, (service.port, service.sandbox_port))
    # A pooled disk's loop device is released when its mount goes (autoclear): soon after.
    eventually(
        lambda: pooled(service.root),
        until=lambda left: left == {"mounts": [], "loops": [], "spares": []},
        within=RELEASE_SECONDS,
        what="nothing left by a clean stop",
    )
    assert_kept(deployment, kept)
    service.start()
    service.wait_ready()
    assert_reachable(kept)


# --------------------------------------------------------------------------------- ports
@contextlib.contextmanager
def answering(port: int) -> Iterator[http.server.ThreadingHTTPServer]:
    """An HTTP server of this process on ``port`` answering 200 to everything, as an old
    instance's orphan would to a readiness probe."""

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_start_on_a_held_port_names_the_holder_then_takes_the_port_once_free(
    service: Serve, deployment: Deployment, kept: Kept
) -> None:
    service.stop()
    with answering(service.port):
        process = service.start()

        def output() -> str:
            assert process.poll() is None, service.output()
            return service.output()

        eventually(
            output,
            until=lambda out: f"in use by pid {os.getpid()}" in out,
            within=20,
            what="the holder named",
        )
        assert "[serve] API" not in service.output()  # not ready while the port is held
    service.wait_ready()
    assert_kept(deployment, kept)
    assert_reachable(kept)


def test_a_start_on_a_port_held_past_the_wait_fails_naming_the_holder(service: Serve) -> None:
    service.stop()
    with answering(service.sandbox_port):
        process = service.start("--port-wait", "0.5")
        assert process.wait(timeout=30) != 0
    output = service.output()
    holder = f"127.0.0.1:{service.sandbox_port} (--sandbox-bind) is in use by pid {os.getpid()}"
    assert holder in output and "[serve] API" not in output
    # Nothing was started: the API's port is free.
    assert supervision.port_free("127.0.0.1", service.port)


def test_a_live_server_is_not_up_while_another_process_answers_on_its_port(
    deployment: Deployment,
) -> None:
    # The suite's own servers (tests/support/live_server.py) must not take an orphan's
    # answers for theirs either.
    server = Server(deployment.env, deployment.tmp / "held.log", workers=1)
    try:
        with answering(server.port), pytest.raises(ServerError, match="gunicorn exited"):
            server.start()
    finally:
        server.stop()
