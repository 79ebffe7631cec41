"""The processes of a live e2bfacade (tests/support/live_server.py): :class:`Server` starts
gunicorn, the data plane, the egress proxy when sandboxes have an uplink, and optionally the
lifecycle worker, as a deployment runs them, and stops or kills them; :func:`cleanup_runtime`
removes what they leave on the host besides files (sandboxes, the launcher daemon, cgroup
parents). No pytest here: ``bench/`` uses it too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from e2bfacade import supervision
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START_SECONDS = 30
# The lifecycle worker's tick: short, so that the timeout tests are quick.
WORKER_INTERVAL = 0.2


class ServerError(RuntimeError):
    """The server could not be prepared or started; the message holds its output."""


# ------------------------------------------------------------------------------ process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise ServerError(f"manage.py {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    # Graceful: gunicorn's master ends its workers; the lifecycle worker finishes its tick.
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the session we started it in, nothing else
        process.wait(timeout=5)


# ------------------------------------------------------------------------------ runtime
def kill_all_sandboxes(runtime: Any) -> None:
    """Kill every sandbox of ``runtime`` (a LocalRuntime): listed, on disk or in a cgroup."""
    if not (runtime.root / "sandboxes").exists():
        return
    ids = {p.name for p in (runtime.root / "sandboxes").iterdir() if not p.name.startswith(".")}
    for sandbox_id in ids | runtime.cgroups.list_ids():
        runtime.kill(sandbox_id)
    runtime.sweep()


def _reap(root: Path) -> None:
    """What a server leaves on the host besides files: sandboxes (processes in cgroups), the
    launcher daemon and its keeper (they detach on purpose, so that a restarted service
    keeps its sandboxes) and the runtime's cgroup parents. Run by :func:`cleanup_runtime`."""
    from e2bfacade.runtime.local import LocalRuntime, lxcfs

    runtime = LocalRuntime(root)
    kill_all_sandboxes(runtime)
    runtime.discard_spares()
    if runtime.network is not None:
        runtime.network.teardown()
    # End the daemons of this root only, found by their path or by the socket path on their
    # command line, whatever they call themselves.
    bin_prefix = str(root / "bin").encode() + b"/"
    sock_prefix = str(root / "run" / "sandboxd-").encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].startswith(bin_prefix) or any(sock_prefix in arg for arg in argv):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    lxcfs.stop(root)
    groups = runtime.cgroups
    for parent in [*getattr(groups, "roots", {}).values(), getattr(groups, "root", None)]:
        if parent is not None:
            with contextlib.suppress(OSError):
                parent.rmdir()


def cleanup_runtime(env: dict[str, str], root: Path) -> None:
    """:func:`_reap` ``root``, in a subprocess with the server's settings (so that the caller
    never imports the runtime)."""
    if not root.exists():
        return
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pathlib, tests.support.live_process as lp;"
            " lp._reap(pathlib.Path(sys.argv[1]))",
            str(root),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        print(f"live server: sandbox cleanup failed:\n{proc.stderr}", file=sys.stderr)


# ------------------------------------------------------------------------------- server
def listening(pid: int) -> list[tuple[str, int]]:
    """The TCP (IPv4) addresses process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # TCP_LISTEN
            hex_address, hex_port = fields[1].split(":")
            address = socket.inet_ntoa(struct.pack("<I", int(hex_address, 16)))
            found.append((address, int(hex_port, 16)))
    return found


class Server:
    """One gunicorn master with ``workers`` sync workers, the data plane with
    ``dataplane_workers`` uvicorn workers and, when ``lifecycle_worker``, ``manage.py
    run_worker`` beside it, as a deployment runs them."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        *,
        workers: int = 4,
        lifecycle_worker: bool = False,
        failpoint_dir: Path | None = None,
        dataplane_workers: int = 2,
    ) -> None:
        self.env = env
        self.log_path = log_path
        self.workers = workers
        self.dataplane_workers = dataplane_workers
        self.lifecycle_worker = lifecycle_worker
        self.sandbox_root = Path(env["SANDBOX_ROOT"])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # The data plane (sandboxes/dataplane): the SDK's E2B_SANDBOX_URL.
        self.sandbox_port = free_port()
        self.sandbox_url = f"http://127.0.0.1:{self.sandbox_port}"
        self.failpoint_dir = failpoint_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.dataplane: subprocess.Popen[bytes] | None = None
        self.egress: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start gunicorn (and the lifecycle worker) and wait for ``/health``."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(BIN / "gunicorn"),
                    "--workers",
                    str(self.workers),
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--graceful-timeout",
                    "5",
                    "--backlog",
                    "2048",
                    "--no-control-socket",  # its default path is shared by every gunicorn
                    "--access-logfile",
                    "-",
                    "e2bfacade.wsgi",
                ],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.dataplane = subprocess.Popen(
                [sys.executable, "-m", "sandboxes.dataplane.server"]
                + ["127.0.0.1", str(self.sandbox_port), str(self.dataplane_workers)],
                cwd=REPO,
                env={**self.env, "DJANGO_SETTINGS_MODULE": "e2bfacade.settings"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            if self.env.get("SANDBOX_UPLINK", "none") != "none":
                self.egress = subprocess.Popen(
                    [sys.executable, "manage.py", "run_egress", str(self.sandbox_root)],
                    cwd=REPO,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self.lifecycle_worker:
                self.worker = subprocess.Popen(
                    [sys.executable, "manage.py", "run_worker", "--interval", str(WORKER_INTERVAL)],
                    cwd=REPO,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

        process, dataplane = self.process, self.dataplane
        assert process is not None and dataplane is not None

        def ready() -> bool:
            if process.poll() is not None:
                raise ServerError(f"gunicorn exited at start:\n{self.log_tail()}")
            if self.worker is not None and self.worker.poll() is not None:
                raise ServerError(f"the lifecycle worker exited at start:\n{self.log_tail()}")
            if dataplane.poll() is not None:
                raise ServerError(f"the data plane exited at start:\n{self.log_tail()}")
            # Sandbox connections to named domains go through the egress proxy only while it
            # listens (else their CIDR rules judge them): wait for it.
            if self.egress is not None and not listening(self.egress.pid):
                return False
            # Answered by the processes started here, not by an orphan of an earlier start
            # that still holds the port (e2bfacade/supervision.py).
            if not (
                supervision.serves(process.pid, "127.0.0.1", self.port)
                and supervision.serves(dataplane.pid, "127.0.0.1", self.sandbox_port)
            ):
                return False
            return (
                httpx.get(f"{self.url}/health", timeout=1).status_code == 200
                # No sandbox named: the data plane's 400 says it is up.
                and httpx.get(f"{self.sandbox_url}/health", timeout=1).status_code == 400
            )

        try:
            eventually(
                ready,
                within=START_SECONDS,
                what="the API's and the data plane's /health",
                ignoring=(httpx.HTTPError, OSError),
            )
        except AssertionError as exc:
            raise ServerError(f"{exc}:\n{self.log_tail()}") from None

    def stop(self) -> None:
        """Stop the lifecycle worker, the data plane and gunicorn gracefully (SIGKILL after
        15 s)."""
        _stop(self.worker)
        _stop(self.egress)
        _stop(self.dataplane)
        _stop(self.process)

    def kill(self) -> None:
        """SIGKILL gunicorn (master and workers) and the lifecycle worker, as a crash or an
        OOM killer would: nothing gets to clean up. Sandboxes keep running (their launcher
        lives in a session of its own); the database and the sandbox root stay."""
        for process in (self.process, self.worker, self.dataplane):
            if process is not None and process.poll() is None:
                # The session each was started in (start_new_session): theirs, nothing else.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)

    def restart(self, *, crash: bool = True) -> None:
        """Stop the service (SIGKILL when ``crash``, else gracefully) and start a fresh one
        on the same database, sandbox root and port."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    def run_worker_once(self, *extra_args: str, env: dict[str, str] | None = None) -> str:
        """One full tick of ``run_worker --once`` with the server's settings."""
        return manage(env or self.env, "run_worker", "--once", *extra_args)

    def arm(self, point: str) -> None:
        """Make failpoint ``point`` fire for the next request that reaches it."""
        assert self.failpoint_dir is not None, "this server has no failpoints"
        (self.failpoint_dir / point).unlink(missing_ok=True)

    def fired(self, point: str) -> bool:
        assert self.failpoint_dir is not None
        return (self.failpoint_dir / point).exists()

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def access_log_statuses(self, method: str, path: str) -> list[int]:
        """The statuses gunicorn's access log recorded for ``method path``."""
        needle = f'"{method} {path} HTTP/1.1" '
        statuses = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if needle in line:
                statuses.append(int(line.split(needle, 1)[1].split()[0]))
        return statuses
