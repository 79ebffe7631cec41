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
        ("SANDBOX_SPARES", "-1"),
        ("SANDBOX_SPARES", "many"),
        ("SANDBOX_DOMAIN", "https://sandboxes.example.com"),
        ("SANDBOX_DOMAIN", "sandboxes.example.com/path"),
        ("SANDBOX_DOMAIN", "127.0.0.1"),
        ("SANDBOX_DOMAIN", "sandboxes.example.com:99999"),
        ("SANDBOX_DOMAIN", "-bad-.example.com"),
        ("SANDBOX_DOMAIN", ""),
        ("SANDBOX_DOMAIN", "e2b.app"),
        ("SANDBOX_DOMAIN", "foxtrot-2.e2b.dev"),
    ],
)
def test_malformed_setting_fails_at_start_naming_the_variable(name: str, value: str) -> None:
    result = start_django(**{name: value})

    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured")
    assert name in last_line


@pytest.mark.parametrize(
    ("value", "domain"),
    [
        ("sandboxes.example.com", "sandboxes.example.com"),
        ("Sandboxes.Example.com:8443", "sandboxes.example.com:8443"),
        ("e2bfacade.internal", "e2bfacade.internal"),
    ],
)
def test_sandbox_domain_accepts_a_domain_with_a_port_in_any_case(value: str, domain: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.SANDBOX_DOMAIN)",
        ],
        cwd=settings.BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "e2bfacade.settings", "SANDBOX_DOMAIN": value},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == domain


FLEET = {
    "ETCD_ENDPOINTS": "http://127.0.0.1:2379",
    "FLEET_API_URL": "http://10.0.0.2:3000",
    "FLEET_SANDBOX_URL": "http://10.0.0.2:3001",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/unused",
}


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"FLEET_API_URL": ""}, "FLEET_API_URL"),
        ({"FLEET_SANDBOX_URL": ""}, "FLEET_SANDBOX_URL"),
        ({"DATABASE_URL": "sqlite:////tmp/unused.sqlite3"}, "DATABASE_URL"),
        ({"FLEET_LEASE_SECONDS": "2"}, "FLEET_LEASE_SECONDS"),
        ({"FLEET_PREFIX": "e2bfacade"}, "FLEET_PREFIX"),
    ],
)
def test_a_fleet_host_without_what_a_fleet_needs_fails_at_start(
    overrides: dict[str, str], named: str
) -> None:
    assert start_django(**FLEET).returncode == 0  # the base it varies starts
    result = start_django(**{**FLEET, **overrides})

    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured")
    assert named in last_line
