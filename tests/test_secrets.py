"""No secret leaves its place: the service refuses to start on the built-in (public)
SECRET_KEY, derives no encryption key from it, and reads .env into its settings without
handing it to every process it starts.

The refusals are checked where a user meets them, in fresh processes: ``manage.py`` and
gunicorn started with a controlled environment. Where a test must control ``.env`` too, it
runs the project's own ``e2bfacade/settings.py``, copied unchanged into a temporary
directory: its ``BASE_DIR`` (where it looks for ``.env``) is then that directory, and the
repository's own ``.env``, if a developer has one, plays no part.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from e2bfacade import crypto
from e2bfacade.startup import BUILTIN_SECRET_KEY
from tests.support.live_server import BIN, REPO, free_port

REAL_SECRET_KEY = "k3Vq0s-only-for-this-test-5pZ8xTq2uF7wYc1rN4mB6dH9jL0aE3gK2oS5iU8"
# Variables the tests below control: none may leak in from the suite's own environment.
CONTROLLED = ("SECRET_KEY", "DEBUG", "IDEMPOTENCY_ENCRYPTION_KEYS", "SANDBOX_DOMAIN", "LOG_LEVEL")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory holding ``isolated_settings/settings.py``, a verbatim copy of the project's
    settings; ``.env`` files written into this directory are the ones those settings read."""
    package = tmp_path / "isolated_settings"
    package.mkdir()
    (package / "__init__.py").touch()
    shutil.copy(REPO / "e2bfacade" / "settings.py", package / "settings.py")
    return tmp_path


def controlled_env(project: Path | None = None, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    env["DATABASE_URL"] = "sqlite:////tmp/e2bfacade-secrets-unused.sqlite3"
    env["DJANGO_SETTINGS_MODULE"] = "e2bfacade.settings"
    if project is not None:
        env["DJANGO_SETTINGS_MODULE"] = "isolated_settings.settings"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project), env.get("PYTHONPATH")]))
    env.update(overrides)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The ImproperlyConfigured line a refused start ends with."""
    assert result.returncode != 0, result.stdout
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured: "), result.stderr
    return last_line


# ------------------------------------------------------------------------ SECRET_KEY
def test_manage_py_refuses_to_start_without_a_secret_key_when_debug_is_off(
    project: Path,
) -> None:
    result = manage(controlled_env(project), "check")

    message = refusal(result)
    assert "SECRET_KEY" in message
    assert ".env" in message and "token_urlsafe" in message  # how to set one


@pytest.mark.parametrize("value", [BUILTIN_SECRET_KEY, "", "django-insecure-abc123"])
def test_manage_py_refuses_a_secret_key_anyone_can_know_when_debug_is_off(value: str) -> None:
    # Set explicitly, the value wins over any .env, so the repository's own settings serve.
    result = manage(controlled_env(SECRET_KEY=value), "check")

    assert "SECRET_KEY" in refusal(result)


def test_gunicorn_exits_at_start_on_the_built_in_secret_key(tmp_path: Path) -> None:
    env = controlled_env(SECRET_KEY=BUILTIN_SECRET_KEY, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    process = subprocess.run(
        [
            str(BIN / "gunicorn"),
            "--workers",
            "1",
            "--bind",
            f"127.0.0.1:{free_port()}",
            "--no-control-socket",
            "e2bfacade.wsgi",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert process.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is not set (or is the built-in" in process.stderr


def test_a_real_secret_key_starts_manage_py_with_debug_off() -> None:
    # Guards the refusals above: they fail for SECRET_KEY, not for any other reason.
    result = manage(controlled_env(SECRET_KEY=REAL_SECRET_KEY), "check")

    assert result.returncode == 0, result.stderr


def test_debug_on_accepts_the_built_in_secret_key_given_explicit_encryption_keys() -> None:
    keys = Fernet.generate_key().decode()
    env = controlled_env(
        DEBUG="true", SECRET_KEY=BUILTIN_SECRET_KEY, IDEMPOTENCY_ENCRYPTION_KEYS=keys
    )

    result = manage(env, "check")

    assert result.returncode == 0, result.stderr


# ------------------------------------------------------- IDEMPOTENCY_ENCRYPTION_KEYS
def test_no_encryption_key_is_derived_from_the_built_in_secret_key_even_with_debug_on() -> None:
    result = manage(controlled_env(DEBUG="true", SECRET_KEY=BUILTIN_SECRET_KEY), "check")

    message = refusal(result)
    assert "IDEMPOTENCY_ENCRYPTION_KEYS" in message and "SECRET_KEY" in message


def test_encrypting_a_stored_body_refuses_the_built_in_secret_key(settings: Any) -> None:
    settings.SECRET_KEY = BUILTIN_SECRET_KEY
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = []

    with pytest.raises(ImproperlyConfigured, match="IDEMPOTENCY_ENCRYPTION_KEYS"):
        crypto.encrypt(b'{"envdAccessToken": "secret"}')


def test_the_default_encryption_key_is_derived_from_a_real_secret_key_as_before(
    settings: Any,
) -> None:
    # Deployments that relied on the derived key keep reading what they stored.
    settings.SECRET_KEY = REAL_SECRET_KEY
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = []
    digest = hashlib.sha256(b"e2bfacade.idempotency:" + REAL_SECRET_KEY.encode()).digest()

    token = crypto.encrypt(b"body")

    assert Fernet(base64.urlsafe_b64encode(digest)).decrypt(token) == b"body"


# ------------------------------------------------------------------------------ .env
REPORT = """
import json, os, subprocess, sys
from django.conf import settings
child = subprocess.run(
    [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
    capture_output=True, text=True, check=True,
)
print("REPORT " + json.dumps({
    "secret_key": settings.SECRET_KEY,
    "database": str(settings.DATABASES["default"]["NAME"]),
    "sandbox_domain": settings.SANDBOX_DOMAIN,
    "log_level": settings.LOGGING["root"]["level"],
    "environ": dict(os.environ),
    "child_environ": json.loads(child.stdout),
}))
"""


def test_dotenv_values_reach_the_settings_but_not_os_environ_nor_child_processes(
    project: Path, tmp_path: Path
) -> None:
    database = tmp_path / "from-dotenv.sqlite3"
    (project / ".env").write_text(
        f"SECRET_KEY={REAL_SECRET_KEY}\n"
        f"DATABASE_URL=sqlite:///{database}\n"
        "SANDBOX_DOMAIN=sandboxes.example.test\n"
        "LOG_LEVEL=ERROR\n"
    )
    env = controlled_env(project, LOG_LEVEL="WARNING")  # the real environment wins
    del env["DATABASE_URL"]

    # Through manage.py, as the lifecycle worker and every command start.
    result = manage(env, "shell", "-c", REPORT)

    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line.removeprefix("REPORT "))
    assert report["secret_key"] == REAL_SECRET_KEY
    assert report["database"] == str(database)
    assert report["sandbox_domain"] == "sandboxes.example.test"
    assert report["log_level"] == "WARNING"
    for environ in (report["environ"], report["child_environ"]):
        assert "SECRET_KEY" not in environ
        assert "DATABASE_URL" not in environ
        assert "SANDBOX_DOMAIN" not in environ
        assert environ["LOG_LEVEL"] == "WARNING"
        assert REAL_SECRET_KEY not in json.dumps(environ)


def test_sandbox_domain_defaults_to_localhost_a_name_that_never_leaves_this_machine(
    project: Path,
) -> None:
    script = "from django.conf import settings; print('DOMAIN', settings.SANDBOX_DOMAIN)"

    result = manage(controlled_env(project, SECRET_KEY=REAL_SECRET_KEY), "shell", "-c", script)

    assert result.returncode == 0, result.stderr
    assert "DOMAIN localhost" in result.stdout.splitlines()
