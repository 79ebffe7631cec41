"""A real e2bfacade for the contract tests: gunicorn on a free port, with a database and a
sandbox root of its own, removed afterwards (see :func:`live_server`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The server's SANDBOX_MAX_TIMEOUT_SECONDS: small, so that "over the maximum" is cheap to ask.
MAX_TIMEOUT = 3600
START_SECONDS = 30
# The lifecycle worker's tick: short, so that the timeout tests are quick.
WORKER_INTERVAL = 0.2
# Short: sandboxd's unix socket lives under SANDBOX_ROOT, and such paths must stay < 108 bytes.
TMP_PARENT = "/tmp"


class ServerError(RuntimeError):
    """The server could not be prepared or started; the message holds its output."""


@dataclass
class LiveServer:
    """A running e2bfacade. ``api_key`` belongs to the team ``contract``; ``other_api_key``
    to a second team, for the cross-team checks."""

    url: str
    api_key: str
    other_api_key: str
    env: dict[str, str]
    sandbox_root: Path
    log_path: Path
    max_timeout: int = MAX_TIMEOUT
    workers: int = 4
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    worker: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def start(self) -> None:
        """Start gunicorn and the lifecycle worker on this server's database and sandbox
        root, and wait for ``/health``."""
        _start_processes(self)
        _wait_healthy(self)

    def kill(self) -> None:
        """SIGKILL gunicorn (master and workers) and the lifecycle worker, as a crash or an
        OOM killer would: nothing gets to clean up. Sandboxes keep running (their launcher
        lives in a session of its own); the database and the sandbox root stay."""
        for process in (self.process, self.worker):
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
            _stop(self.worker)
            _stop(self.process)
        self.start()

    def run_worker_once(self, *extra_args: str, env: dict[str, str] | None = None) -> str:
        """One full tick of ``run_worker --once`` with the server's settings."""
        return _manage(env or self.env, "run_worker", "--once", *extra_args)


# ----------------------------------------------------------------------------- database
def _is_postgres(url: str) -> bool:
    return urlsplit(url).scheme in ("postgres", "postgresql", "pgsql")


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@contextlib.contextmanager
def _database(suite_url: str, tmp: Path) -> Iterator[str]:
    """A fresh, empty database for the server of the same kind as the suite's: a new
    PostgreSQL database on the same server (dropped afterwards), or a SQLite file in ``tmp``."""
    if not _is_postgres(suite_url):
        yield f"sqlite:///{tmp / 'contract.sqlite3'}"
        return
    import psycopg

    name = f"e2bfacade_contract_{secrets.token_hex(4)}"
    # The maintenance database: the suite's own may not exist yet.
    admin_url = _with_database(suite_url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(suite_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            # FORCE: a worker connection that outlived gunicorn must not keep it alive.
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ------------------------------------------------------------------------------ process
def _manage(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise ServerError(f"manage.py {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _create_team(env: dict[str, str], name: str) -> str:
    # create_team prints the raw key as its last line.
    return _manage(env, "create_team", name).strip().splitlines()[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(server: LiveServer) -> None:
    assert server.process is not None and server.worker is not None
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerError(f"gunicorn exited at start:\n{server.log_tail()}")
        if server.worker.poll() is not None:
            raise ServerError(f"the lifecycle worker exited at start:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise ServerError(f"gunicorn did not answer /health in {START_SECONDS}s:\n{server.log_tail()}")


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


# What the server leaves on the host besides files: sandboxes (processes in cgroups) and the
# sandboxd launcher, which detaches on purpose so that a restart keeps sandboxes running.
# Run in a subprocess with the server's settings, so this process never imports the runtime.
_CLEANUP = """
import os, signal, sys
from pathlib import Path
from sandboxes.runtime.local import LocalRuntime
root = Path(sys.argv[1])
runtime = LocalRuntime(root)
for info in runtime.list():
    runtime.kill(info.sandbox_id)
runtime.reap_orphans()
# sandboxd runs as <root>/bin/sandboxd-<hash>: end the one of this root, by its pid.
prefix = str(root / "bin").encode() + b"/"
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")[0]
    except OSError:
        continue
    if argv0.startswith(prefix):
        os.kill(int(pid), signal.SIGTERM)
# The runtime's parent cgroup(s), now empty.
groups = runtime.cgroups
for parent in [*getattr(groups, "roots", {}).values(), getattr(groups, "root", None)]:
    if parent is not None:
        try:
            parent.rmdir()
        except OSError:
            pass
"""


def _cleanup_runtime(env: dict[str, str], root: Path) -> None:
    if not root.exists():
        return
    proc = subprocess.run(
        [sys.executable, "-c", _CLEANUP, str(root)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        print(f"contract tests: sandbox cleanup failed:\n{proc.stderr}", file=sys.stderr)


def _start_processes(server: LiveServer) -> None:
    port = urlsplit(server.url).port
    with open(server.log_path, "ab") as log:
        server.process = subprocess.Popen(
            [
                str(BIN / "gunicorn"),
                "--workers",
                str(server.workers),
                "--bind",
                f"127.0.0.1:{port}",
                "--graceful-timeout",
                "5",
                "--no-control-socket",  # its default path is shared by every gunicorn
                "--access-logfile",
                "-",
                "e2bfacade.wsgi",
            ],
            cwd=REPO,
            env=server.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        server.worker = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "run_worker",
                "--interval",
                str(WORKER_INTERVAL),
            ],
            cwd=REPO,
            env=server.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextlib.contextmanager
def live_server(
    suite_database_url: str, workers: int = 4, extra_env: dict[str, str] | None = None
) -> Iterator[LiveServer]:
    """Migrate a fresh database, create two teams, start gunicorn and the lifecycle worker
    (as a deployment runs them) and wait for ``/health``. On exit: stop both, kill every
    sandbox they made, drop the database, delete the files. ``extra_env`` is added to the
    environment of every process (e.g. failpoints, ``API_RATE_LIMIT``)."""
    tmp = Path(tempfile.mkdtemp(prefix="e2bc-", dir=TMP_PARENT))
    sandbox_root = tmp / "root"
    try:
        with _database(suite_database_url, tmp) as database_url:
            env = {
                **os.environ,
                "DATABASE_URL": database_url,
                "SANDBOX_ROOT": str(sandbox_root),
                "SANDBOX_MAX_TIMEOUT_SECONDS": str(MAX_TIMEOUT),
                "DJANGO_SETTINGS_MODULE": "e2bfacade.settings",
                "PYTHONUNBUFFERED": "1",
                **(extra_env or {}),
            }
            _manage(env, "migrate", "--no-input", "-v", "0")
            port = _free_port()
            server = LiveServer(
                url=f"http://127.0.0.1:{port}",
                api_key=_create_team(env, "contract"),
                other_api_key=_create_team(env, "contract-other"),
                env=env,
                sandbox_root=sandbox_root,
                log_path=tmp / "server.log",
                max_timeout=int(env["SANDBOX_MAX_TIMEOUT_SECONDS"]),
                workers=workers,
            )
            try:
                server.start()
                yield server
            finally:
                _stop(server.worker)
                _stop(server.process)
                _cleanup_runtime(env, sandbox_root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
