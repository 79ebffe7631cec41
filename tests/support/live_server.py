"""A real e2bfacade on its own: a fresh database (a new PostgreSQL database beside the
suite's ``DATABASE_URL``, or a temporary SQLite file), migrated, with teams, a short
``SANDBOX_ROOT`` under /tmp, and gunicorn servers (with or without the lifecycle worker)
started on it with whatever environment a caller needs (failpoints, lease, rate limit).

:class:`Deployment` owns the database and the sandbox root; :class:`Server` is one gunicorn
(plus, optionally, ``run_worker``) on them; :func:`live_server` is the one-server shorthand
the black-box suites use. No pytest here: ``bench/`` uses it too. Everything made is
removed by :meth:`Deployment.close`: the servers, sandboxes, the launcher daemon, cgroup
parents, the database, the temporary directory. The server's processes are in
live_process.py, the databases (cloned from a migrated one) in live_database.py.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.live_database import (
    connect,
    create_teams,
    is_postgres,
    libpq_url,
    migrated_postgres,
    migrated_sqlite,
    query,
    suite_database_url,
    with_database,
)
from tests.support.live_process import (
    BIN,
    REPO,
    Server,
    ServerError,
    cleanup_runtime,
    free_port,
    kill_all_sandboxes,
    listening,
    manage,
)

# What the suites and bench/ import from here; the processes live in live_process.py and the
# databases in live_database.py.
__all__ = [
    "BIN",
    "REPO",
    "Deployment",
    "LiveServer",
    "Server",
    "ServerError",
    "TeamKey",
    "cleanup_runtime",
    "free_port",
    "is_postgres",
    "listening",
    "live_server",
    "manage",
    "suite_database_url",
]

# live_server()'s SANDBOX_MAX_TIMEOUT_SECONDS: small, so that "over the maximum" is cheap.
MAX_TIMEOUT = 3600
# Short: sandboxd's unix socket lives under SANDBOX_ROOT, and such paths must stay < 108 bytes.
TMP_PARENT = "/tmp"


@dataclass(frozen=True)
class TeamKey:
    team_id: int
    api_key: str


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
                self._admin_url = libpq_url(with_database(base, "postgres"))
                self.database_url = with_database(base, self._db_name)
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
        made = create_teams(self.database_url, names)
        return {name: TeamKey(team_id=tid, api_key=key) for name, (tid, key) in made.items()}

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
