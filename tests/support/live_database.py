"""The databases of the live servers (tests/support/live_server.py): the suite's own URL,
connections and one-off queries on PostgreSQL or SQLite, and a fresh database made as a copy
of a migrated one, so that a deployment starts in a fraction of what ``migrate`` takes. No
pytest here: ``bench/`` uses it too.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import hashlib
import os
import secrets
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tests.support.live_process import REPO, manage


def suite_database_url() -> str:
    return os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"


def is_postgres(url: str) -> bool:
    return urlsplit(url).scheme in ("postgres", "postgresql", "pgsql")


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def libpq_url(url: str) -> str:
    """psycopg wants postgresql:// (django-environ also accepts postgres:// and pgsql://)."""
    return urlunsplit(urlsplit(url)._replace(scheme="postgresql"))


@contextlib.contextmanager
def connect(database_url: str) -> Iterator[Any]:
    """An autocommit connection to ``database_url`` (PostgreSQL or SQLite)."""
    if is_postgres(database_url):
        import psycopg

        with psycopg.connect(libpq_url(database_url), autocommit=True, connect_timeout=10) as conn:
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
                    {**env, "DATABASE_URL": with_database(base, building)},
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


def create_teams(database_url: str, names: list[str]) -> dict[str, tuple[int, str]]:
    """A team (new or existing) and a fresh API key for each of ``names``: {name: (team id,
    raw key)}. Written straight into a migrated database (as ``api_key_create`` would: the
    key's SHA-256 and prefix, e2bfacade/models.py), not through ``manage.py shell``, whose
    start is a second of CPU per deployment. (Its constants are repeated here: this runs
    without Django set up; a key made otherwise fails every request of the test.)"""
    postgres = is_postgres(database_url)
    mark = "%s" if postgres else "?"
    now: Any = dt.datetime.now(dt.UTC)
    if not postgres:
        now = now.replace(tzinfo=None).isoformat(" ")  # as Django stores it in SQLite
    made: dict[str, tuple[int, str]] = {}
    with connect(database_url) as conn:
        for name in names:
            conn.execute(
                f"INSERT INTO e2bfacade_team (name, created_at) VALUES ({mark}, {mark}) "
                "ON CONFLICT (name) DO NOTHING",
                (name, now),
            )
            (team_id,) = conn.execute(
                f"SELECT id FROM e2bfacade_team WHERE name = {mark}", (name,)
            ).fetchone()
            raw = "e2b_" + secrets.token_hex(20)
            conn.execute(
                "INSERT INTO e2bfacade_apikey (team_id, name, key_hash, prefix, created_at, "
                "public_id, value_length, masked_suffix) "
                f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark}, {mark}, {mark})",
                (
                    team_id,
                    "live",
                    hashlib.sha256(raw.encode()).hexdigest(),
                    raw[:10],
                    now,
                    uuid.uuid4().hex,  # PostgreSQL's uuid and Django's SQLite text alike
                    40,
                    raw[-4:],
                ),
            )
            made[name] = (int(team_id), raw)
    return made
