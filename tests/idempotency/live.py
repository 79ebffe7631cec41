"""A real e2bfacade deployment for the process-level tests and the benchmarks: a fresh
database (PostgreSQL beside the suite's ``DATABASE_URL``, or a temporary SQLite file),
migrated once, a pool of teams, a short ``SANDBOX_ROOT`` under /tmp, and gunicorn servers
started on it with whatever environment a test needs (failpoints, lease, wait).

No pytest here: ``bench/`` uses it too. Everything it made is removed by ``close()``:
sandboxes, the launcher daemon, cgroup parents, the database, the temporary directory.
"""

from __future__ import annotations

import contextlib
import json
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START_SECONDS = 30

_CREATE_TEAMS = """
import json, os
from e2bfacade.models import Team, api_key_create
out = {}
for name in json.loads(os.environ["E2BI_TEAMS"]):
    team, _ = Team.objects.get_or_create(name=name)
    _, raw = api_key_create(team=team, name="live")
    out[name] = [team.pk, raw]
print("TEAMS " + json.dumps(out))
"""


def suite_database_url() -> str:
    return os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"


def is_postgres(url: str) -> bool:
    return urlsplit(url).scheme in ("postgres", "postgresql", "pgsql")


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def _libpq(url: str) -> str:
    """psycopg wants postgresql:// (django-environ also accepts postgres:// and pgsql://)."""
    return urlunsplit(urlsplit(url)._replace(scheme="postgresql"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TeamKey:
    team_id: int
    api_key: str


class Server:
    """One gunicorn master with ``workers`` sync workers."""

    def __init__(self, env: dict[str, str], log_path: Path, workers: int = 4) -> None:
        self.env = env
        self.log_path = log_path
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.failpoint_dir = (
            Path(env["E2BFACADE_FAILPOINT_DIR"]) if env.get("E2BFACADE_FAILPOINT_DIR") else None
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.failpoint_dir is not None:
            # Every configured point starts disarmed (its fired-once marker exists); a test
            # arms one by removing its marker, and it fires for exactly one request.
            self.failpoint_dir.mkdir(parents=True, exist_ok=True)
            for item in filter(None, self.env.get("E2BFACADE_FAILPOINTS", "").split(",")):
                (self.failpoint_dir / item.partition("=")[0]).touch()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(BIN / "gunicorn"),
                    "-w",
                    str(self.workers),
                    "-b",
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
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited at start:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(
            f"gunicorn did not answer /health in {START_SECONDS}s:\n{self.log_tail()}"
        )

    def arm(self, point: str) -> None:
        """Make failpoint ``point`` fire for the next request that reaches it."""
        assert self.failpoint_dir is not None, "this server has no failpoints"
        (self.failpoint_dir / point).unlink(missing_ok=True)

    def fired(self, point: str) -> bool:
        assert self.failpoint_dir is not None
        return (self.failpoint_dir / point).exists()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)  # graceful: the master reaps its workers
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session, started by us
            self.process.wait(timeout=5)

    def log_tail(self, lines: int = 60) -> str:
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


class Deployment:
    """A database and a sandbox root shared by the servers started on them."""

    def __init__(self, *, postgres: bool, teams: int = 8, prefix: str = "e2bi") -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
        self.sandbox_root = self.tmp / "root"
        self.servers: list[Server] = []
        self._admin_url: str | None = None
        self._db_name: str | None = None
        base = suite_database_url()
        if postgres:
            if not is_postgres(base):
                raise RuntimeError("a PostgreSQL deployment needs a postgres:// DATABASE_URL")
            self._db_name = f"{prefix}_{secrets.token_hex(4)}"
            self._admin_url = _libpq(_with_database(base, "postgres"))
            with psycopg.connect(self._admin_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self._db_name}"')
            self.database_url = _with_database(base, self._db_name)
        else:
            self.database_url = f"sqlite:///{self.tmp / 'live.sqlite3'}"
        self.postgres = postgres
        self.env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "SANDBOX_ROOT": str(self.sandbox_root),
            "DJANGO_SETTINGS_MODULE": "e2bfacade.settings",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
        }
        for name in ("E2BFACADE_FAILPOINTS", "E2BFACADE_FAILPOINT_DIR"):
            self.env.pop(name, None)
        try:
            self.manage("migrate", "--no-input", "-v", "0")
            self.teams = self.create_teams(teams)
        except BaseException:
            self.close()
            raise
        self._free_teams = list(self.teams.values())

    # ------------------------------------------------------------------------ processes
    def manage(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
        proc = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def create_teams(self, count: int) -> dict[str, TeamKey]:
        names = [f"live-{secrets.token_hex(3)}-{i}" for i in range(count)]
        out = self.manage(
            "shell", "-c", _CREATE_TEAMS, env={**self.env, "E2BI_TEAMS": json.dumps(names)}
        )
        line = next(x for x in out.splitlines() if x.startswith("TEAMS "))
        made = json.loads(line.removeprefix("TEAMS "))
        return {name: TeamKey(team_id=v[0], api_key=v[1]) for name, v in made.items()}

    def take_team(self) -> TeamKey:
        """A team no other caller has used: its sandboxes and records are its test's alone."""
        if not self._free_teams:
            self._free_teams = list(self.create_teams(8).values())
        return self._free_teams.pop()

    def server(self, workers: int = 4, **extra_env: str) -> Server:
        """Start a server with ``extra_env`` on top of the deployment's environment. A
        ``E2BFACADE_FAILPOINTS`` server gets its own marker directory."""
        n = len(self.servers)
        env = {**self.env, **extra_env}
        if "E2BFACADE_FAILPOINTS" in extra_env:
            env["E2BFACADE_FAILPOINT_DIR"] = str(self.tmp / f"failpoints-{n}")
        server = Server(env, self.tmp / f"gunicorn-{n}.log", workers=workers)
        self.servers.append(server)
        server.start()
        return server

    # -------------------------------------------------------------------------- queries
    @contextlib.contextmanager
    def db(self) -> Iterator[Any]:
        """A connection to the deployment's database (PostgreSQL or SQLite), autocommit."""
        if self.postgres:
            with psycopg.connect(_libpq(self.database_url), autocommit=True) as conn:
                yield conn
        else:
            import sqlite3

            lite = sqlite3.connect(self.database_url.removeprefix("sqlite:///"), timeout=20)
            lite.isolation_level = None
            try:
                yield lite
            finally:
                lite.close()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if not self.postgres:
            sql = sql.replace("%s", "?")
        with self.db() as conn:
            return list(conn.execute(sql, params).fetchall())

    def sandboxes(self, team: TeamKey) -> list[tuple[str, str]]:
        return [
            (r[0], r[1])
            for r in self.query(
                "SELECT sandbox_id, state FROM sandboxes_sandbox WHERE team_id = %s "
                "ORDER BY sandbox_id",
                (team.team_id,),
            )
        ]

    def record(self, team: TeamKey, key: str) -> dict[str, Any] | None:
        rows = self.query(
            "SELECT state, attempt, resource_id, response_status, expires_at "
            "FROM idempotency_idempotencyrecord WHERE team_id = %s AND key = %s",
            (team.team_id, key),
        )
        if not rows:
            return None
        state, attempt, resource_id, status, expires_at = rows[0]
        return {
            "state": state,
            "attempt": attempt,
            "resource_id": resource_id,
            "response_status": status,
            "expires_at": expires_at,
        }

    # -------------------------------------------------------------------------- runtime
    def runtime(self) -> Any:
        from sandboxes.runtime.local import LocalRuntime

        return LocalRuntime(self.sandbox_root)

    def runtime_ids(self) -> set[str]:
        if not (self.sandbox_root / "sandboxes").exists():
            return set()
        return {info.sandbox_id for info in self.runtime().list()}

    def kill_all_sandboxes(self) -> None:
        if not (self.sandbox_root / "sandboxes").exists():
            return
        rt = self.runtime()
        ids = {p.name for p in (rt.root / "sandboxes").iterdir() if not p.name.startswith(".")}
        for sandbox_id in ids | rt.cgroups.list_ids():
            rt.kill(sandbox_id)
        rt.reap_orphans()

    # ------------------------------------------------------------------------- teardown
    def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()
        with contextlib.suppress(Exception):
            self._cleanup_runtime()
        if self._admin_url and self._db_name:
            with (
                contextlib.suppress(Exception),
                psycopg.connect(self._admin_url, autocommit=True) as conn,
            ):
                # FORCE: a worker that did not exit in time must not keep the database.
                conn.execute(f'DROP DATABASE IF EXISTS "{self._db_name}" WITH (FORCE)')
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _cleanup_runtime(self) -> None:
        if not (self.sandbox_root / "sandboxes").exists():
            return
        self.kill_all_sandboxes()
        rt = self.runtime()
        # The launcher daemon and its keeper detach on purpose (a restarted service keeps
        # its sandboxes): end the ones of this root only, found by the socket path on
        # their command line, whatever they call themselves.
        bin_prefix = str(self.sandbox_root / "bin").encode() + b"/"
        sock_prefix = str(self.sandbox_root / "run" / "sandboxd-").encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].startswith(bin_prefix) or any(sock_prefix in arg for arg in argv):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        cg: Any = rt.cgroups
        for parent in list(cg.roots.values()) if cg.version == 1 else [cg.root]:
            with contextlib.suppress(OSError):
                parent.rmdir()
