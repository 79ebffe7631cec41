"""Malformed configuration stops the process at start with a message naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings


def start_django(**overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "e2bfacade.settings", **overrides}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_valid_configuration_starts() -> None:
    # Guards the failure tests below: they must fail for their variable, not for any reason.
    result = start_django(DATABASE_URL="sqlite:////tmp/unused.sqlite3")

    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("IDEMPOTENCY_TTL_SECONDS", "one day"),
        ("IDEMPOTENCY_TTL_SECONDS", "0"),
        ("IDEMPOTENCY_LEASE_SECONDS", "1.5"),
        ("SANDBOX_MAX_TIMEOUT_SECONDS", "-5"),
        ("DATABASE_URL", "not a url"),
        ("DATABASE_URL", "postgres://user@host:notaport/db"),
        ("DATABASE_URL", "mongodb://localhost/db"),
        ("SANDBOX_ROOT", "relative/path"),
        ("SANDBOX_RUNTIME", "firecracker"),
    ],
)
def test_malformed_setting_fails_at_start_naming_the_variable(name: str, value: str) -> None:
    result = start_django(**{name: value})

    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured")
    assert name in last_line
