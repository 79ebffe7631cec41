"""A real e2bfacade on its own: a fresh database (a new PostgreSQL database beside the
suite's ``DATABASE_URL``, or a temporary SQLite file), migrated, with teams, a short
``SANDBOX_ROOT`` under /tmp, and gunicorn servers (with or without the lifecycle worker)
started on it with whatever environment a caller needs (failpoints, lease, rate limit).

:class:`Deployment` owns the database and the sandbox root; :class:`Server` is one gunicorn
(plus, optionally, ``run_worker``) on them; :func:`live_server` is the one-server shorthand
the black-box suites use. No pytest here: ``bench/`` uses it too. Everything made is
removed by :meth:`Deployment.close`: the servers, sandboxes, the launcher daemon, cgroup
parents, the database, the temporary directory.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from e2bfacade import supervision

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# live_server()'s SANDBOX_MAX_TIMEOUT_SECONDS: small, so that "over the maximum" is cheap.
MAX_TIMEOUT = 3600
START_SECONDS = 30
# The lifecycle worker's tick: short, so that the timeout tests are quick.
WORKER_INTERVAL = 0.2
# Short: sandboxd's unix socket lives under SANDBOX_ROOT, and such paths must stay < 108 bytes.
TMP_PARENT = "/tmp"

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


class ServerError(RuntimeError):
    """The server could not be prepared or started; the message holds its output."""


@dataclass(frozen=True)
class TeamKey:
    team_id: int
    api_key: str


# ----------------------------------------------------------------------------- database
def suite_database_url() -> str:
    return os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"


def is_postgres(url: str) -> bool:
    return urlsplit(url).scheme in ("postgres", "postgresql", "pgsql")


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def _libpq(url: str) -> str:
    """psycopg wants postgresql:// (django-environ also accepts postgres:// and pgsql://)."""
    return urlunsplit(urlsplit(url)._replace(scheme="postgresql"))


@contextlib.contextmanager
def connect(database_url: str) -> Iterator[Any]:
    """An autocommit connection to ``database_url`` (PostgreSQL or SQLite)."""
    if is_postgres(database_url):
        import psycopg

        with psycopg.connect(_libpq(database_url), autocommit=True, connect_timeout=10) as conn:
            yield conn
    else:
        lite = sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=20)
        lite.isolation_level = None
        try:
            yield lite
        finally:
            lite.close()


def query(database_url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement (PostgreSQL ``%s`` placeholders) on ``database_url``."""
    if not is_postgres(database_url):
        sql = sql.replace("%s", "?")
    with connect(database_url) as conn:
        return list(conn.execute(sql, params).fetchall())


def migrations_digest() -> str:
    """A digest of every migration file: a migrated template made from other migrations is
    never cloned."""
    digest = hashlib.sha256()
    for path in sorted(REPO.glob("*/migrations/*.py")):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


_sqlite_templates: dict[str, Path] = {}


def migrated_postgres(admin_url: str, base: str, name: str, env: dict[str, str]) -> None:
    """Create database ``name`` as a copy of a migrated template (``CREATE DATABASE ...
    TEMPLATE``: 0.1 s against 1.9 s for ``migrate``), migrating the template first if no
    run has yet. The template is named by :func:`migrations_digest`; it is built under a
    name of its own and renamed, so a run killed midway never leaves a half-migrated one."""
    import psycopg

    template = f"e2bfacade_tmpl_{migrations_digest()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (template,))
        if found.fetchone() is None:
            # Templates of older migrations: no run clones them again.
            stale = conn.execute(
                "SELECT datname FROM pg_database WHERE datname ~ '^e2bfacade_tmpl_[0-9a-f]{12}$'"
            ).fetchall()
            for (old,) in stale:
                conn.execute(f'DROP DATABASE IF EXISTS "{old}"')
            building = f"{template}_{secrets.token_hex(4)}"
            conn.execute(f'CREATE DATABASE "{building}"')
            try:
                manage(
                    {**env, "DATABASE_URL": _with_database(base, building)},
                    "migrate",
                    "--no-input",
                    "-v",
                    "0",
                )
                conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{template}"')
            except psycopg.errors.DuplicateDatabase:
                pass  # another run made it meanwhile
            finally:
                conn.execute(f'DROP DATABASE IF EXISTS "{building}"')
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')


def migrated_sqlite(path: Path, env: dict[str, str]) -> None:
    """Copy a migrated SQLite file to ``path``, migrating one first (once per process)."""
    digest = migrations_digest()
    template = _sqlite_templates.get(digest)
    if template is None or not template.exists():
        template = Path(tempfile.mkdtemp(prefix="e2bfacade-tmpl-")) / "migrated.sqlite3"
        manage({**env, "DATABASE_URL": f"sqlite:///{template}"}, "migrate", "--no-input", "-v", "0")
        atexit.register(shutil.rmtree, template.parent, ignore_errors=True)
        _sqlite_templates[digest] = template
    shutil.copyfile(template, path)


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
            "import sys, pathlib, tests.support.live_server as ls;"
            " ls._reap(pathlib.Path(sys.argv[1]))",
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
                    [sys.executable, "-m", "e2bfacade.runtime.local.net.egress"]
                    + [str(self.sandbox_root)],
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
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"gunicorn exited at start:\n{self.log_tail()}")
            if self.worker is not None and self.worker.poll() is not None:
                raise ServerError(f"the lifecycle worker exited at start:\n{self.log_tail()}")
            if self.dataplane is not None and self.dataplane.poll() is not None:
                raise ServerError(f"the data plane exited at start:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError, OSError):
                # Sandbox connections to named domains go through the egress proxy only
                # while it listens (else their CIDR rules judge them): wait for it.
                if self.egress is not None and not listening(self.egress.pid):
                    time.sleep(0.05)
                    continue
                # Answered by the processes started here, not by an orphan of an earlier
                # start that still holds the port (e2bfacade/supervision.py).
                if not (
                    supervision.serves(self.process.pid, "127.0.0.1", self.port)
                    and supervision.serves(self.dataplane.pid, "127.0.0.1", self.sandbox_port)
                ):
                    time.sleep(0.05)
                    continue
                if (
                    httpx.get(f"{self.url}/health", timeout=1).status_code == 200
                    # No sandbox named: the data plane's 400 says it is up.
                    and httpx.get(f"{self.sandbox_url}/health", timeout=1).status_code == 400
                ):
                    return
            time.sleep(0.05)
        raise ServerError(
            f"gunicorn did not answer /health in {START_SECONDS}s:\n{self.log_tail()}"
        )

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


class LiveServer(Server):
    """The server :func:`live_server` starts. ``api_key`` belongs to the team ``contract``;
    ``other_api_key`` to a second team, for the cross-team checks."""

    def __init__(
        self, env: dict[str, str], log_path: Path, *, api_key: str, other_api_key: str, **kw: Any
    ) -> None:
        super().__init__(env, log_path, lifecycle_worker=True, **kw)
        self.api_key = api_key
        self.other_api_key = other_api_key
        self.max_timeout = int(env.get("SANDBOX_MAX_TIMEOUT_SECONDS", MAX_TIMEOUT))


# --------------------------------------------------------------------------- deployment
class Deployment:
    """A database and a sandbox root shared by the servers started on them.

    ``postgres``: a PostgreSQL database (the suite's must be PostgreSQL), a SQLite file, or
    (None) the kind of the suite's. ``teams``: how many anonymous teams to make (see
    :meth:`take_team`); ``team_names``: named teams too, in ``teams_by_name``. ``extra_env``
    is in the environment of every process, migrations included."""

    def __init__(
        self,
        *,
        postgres: bool | None = None,
        teams: int = 8,
        team_names: Iterable[str] = (),
        prefix: str = "e2bi",
        extra_env: dict[str, str] | None = None,
        log_level: str | None = "WARNING",
        suite_url: str | None = None,
    ) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=TMP_PARENT))
        self.sandbox_root = self.tmp / "root"
        self.servers: list[Server] = []
        self.env: dict[str, str] = {}
        self._admin_url: str | None = None
        self._db_name: str | None = None
        base = suite_url or suite_database_url()
        self.postgres = is_postgres(base) if postgres is None else postgres
        try:
            if self.postgres:
                if not is_postgres(base):
                    raise ServerError("a PostgreSQL deployment needs a postgres:// DATABASE_URL")

                self._db_name = f"{prefix}_{secrets.token_hex(4)}"
                # The maintenance database: the suite's own may not exist yet.
                self._admin_url = _libpq(_with_database(base, "postgres"))
                self.database_url = _with_database(base, self._db_name)
            else:
                self.database_url = f"sqlite:///{self.tmp / 'live.sqlite3'}"
            self.env = {
                **os.environ,
                "DATABASE_URL": self.database_url,
                "SANDBOX_ROOT": str(self.sandbox_root),
                "DJANGO_SETTINGS_MODULE": "e2bfacade.settings",
                "PYTHONUNBUFFERED": "1",
                # A deployment's own secret, as serve.sh makes one: the service refuses the
                # built-in one (e2bfacade/startup.py). ``extra_env`` may replace it.
                "SECRET_KEY": secrets.token_urlsafe(50),
            }
            if log_level:
                self.env["LOG_LEVEL"] = log_level
            for name in ("E2BFACADE_FAILPOINTS", "E2BFACADE_FAILPOINT_DIR"):
                self.env.pop(name, None)
            self.env.update(extra_env or {})
            # A copy of a migrated database (what ``migrate`` makes, from the same files).
            if self._admin_url is not None and self._db_name is not None:
                migrated_postgres(self._admin_url, base, self._db_name, self.env)
            else:
                migrated_sqlite(self.tmp / "live.sqlite3", self.env)
            names = [f"live-{secrets.token_hex(3)}-{i}" for i in range(teams)]
            made = self.create_teams([*team_names, *names])
        except BaseException:
            self.close()
            raise
        self.teams_by_name = made
        self.teams = {name: made[name] for name in names}
        self._free_teams = list(self.teams.values())

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------ processes
    def manage(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
        return manage(env or self.env, *args, timeout=timeout)

    def create_teams(self, names: list[str]) -> dict[str, TeamKey]:
        """A team (new or existing) and a fresh API key for each of ``names``."""
        if not names:
            return {}
        out = self.manage(
            "shell", "-c", _CREATE_TEAMS, env={**self.env, "E2BI_TEAMS": json.dumps(names)}
        )
        line = next(x for x in out.splitlines() if x.startswith("TEAMS "))
        made = json.loads(line.removeprefix("TEAMS "))
        return {name: TeamKey(team_id=v[0], api_key=v[1]) for name, v in made.items()}

    def take_team(self) -> TeamKey:
        """A team no other caller has used: its sandboxes and records are its test's alone."""
        if not self._free_teams:
            names = [f"live-{secrets.token_hex(3)}-{i}" for i in range(8)]
            self._free_teams = list(self.create_teams(names).values())
        return self._free_teams.pop()

    def start(self, server: Server) -> Server:
        """Start ``server``; :meth:`close` stops it."""
        self.servers.append(server)
        server.start()
        return server

    def server(self, workers: int = 4, lifecycle_worker: bool = False, **extra_env: str) -> Server:
        """Start a server with ``extra_env`` on top of the deployment's environment. A
        ``E2BFACADE_FAILPOINTS`` server without a ``E2BFACADE_FAILPOINT_DIR`` gets a marker
        directory of its own, where every configured point starts disarmed (its fired-once
        marker exists): a test arms one (:meth:`Server.arm`), and it fires for exactly one
        request."""
        n = len(self.servers)
        env = {**self.env, **extra_env}
        failpoint_dir = None
        if "E2BFACADE_FAILPOINTS" in extra_env and "E2BFACADE_FAILPOINT_DIR" not in extra_env:
            failpoint_dir = self.tmp / f"failpoints-{n}"
            env["E2BFACADE_FAILPOINT_DIR"] = str(failpoint_dir)
            failpoint_dir.mkdir(parents=True, exist_ok=True)
            for item in filter(None, env["E2BFACADE_FAILPOINTS"].split(",")):
                (failpoint_dir / item.partition("=")[0]).touch()
        elif env.get("E2BFACADE_FAILPOINT_DIR"):
            failpoint_dir = Path(env["E2BFACADE_FAILPOINT_DIR"])
        server = Server(
            env,
            self.tmp / f"gunicorn-{n}.log",
            workers=workers,
            lifecycle_worker=lifecycle_worker,
            failpoint_dir=failpoint_dir,
        )
        return self.start(server)

    # -------------------------------------------------------------------------- queries
    @contextlib.contextmanager
    def db(self) -> Iterator[Any]:
        """A connection to the deployment's database (PostgreSQL or SQLite), autocommit."""
        with connect(self.database_url) as conn:
            yield conn

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return query(self.database_url, sql, params)

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
        from e2bfacade.runtime.local import LocalRuntime

        return LocalRuntime(self.sandbox_root)

    def runtime_ids(self) -> set[str]:
        if not (self.sandbox_root / "sandboxes").exists():
            return set()
        return {info.sandbox_id for info in self.runtime().list()}

    def kill_all_sandboxes(self) -> None:
        if (self.sandbox_root / "sandboxes").exists():
            kill_all_sandboxes(self.runtime())

    # ------------------------------------------------------------------------- teardown
    def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()
        with contextlib.suppress(Exception):
            cleanup_runtime(self.env, self.sandbox_root)
        if self._admin_url and self._db_name:
            import psycopg

            with (
                contextlib.suppress(Exception),
                psycopg.connect(self._admin_url, autocommit=True) as conn,
            ):
                # FORCE: a worker that did not exit in time must not keep the database.
                conn.execute(f'DROP DATABASE IF EXISTS "{self._db_name}" WITH (FORCE)')
        shutil.rmtree(self.tmp, ignore_errors=True)


@contextlib.contextmanager
def live_server(
    suite_database_url: str,
    workers: int = 4,
    extra_env: dict[str, str] | None = None,
    dataplane_workers: int = 2,
) -> Iterator[LiveServer]:
    """Migrate a fresh database of the suite's kind, create two teams, start gunicorn and the
    lifecycle worker (as a deployment runs them) and wait for ``/health``. On exit: stop
    both, kill every sandbox they made, drop the database, delete the files. ``extra_env``
    is added to the environment of every process (e.g. failpoints, ``API_RATE_LIMIT``);
    ``dataplane_workers``: the data plane's uvicorn workers (each has its own threads)."""
    env = {"SANDBOX_MAX_TIMEOUT_SECONDS": str(MAX_TIMEOUT), **(extra_env or {})}
    with Deployment(
        teams=0,
        team_names=["contract", "contract-other"],
        prefix="e2bc",
        extra_env=env,
        log_level=None,
        suite_url=suite_database_url,
    ) as deployment:
        failpoint_dir = deployment.env.get("E2BFACADE_FAILPOINT_DIR")
        server = LiveServer(
            deployment.env,
            deployment.tmp / "server.log",
            api_key=deployment.teams_by_name["contract"].api_key,
            other_api_key=deployment.teams_by_name["contract-other"].api_key,
            workers=workers,
            failpoint_dir=Path(failpoint_dir) if failpoint_dir else None,
            dataplane_workers=dataplane_workers,
        )
        deployment.start(server)
        yield server
