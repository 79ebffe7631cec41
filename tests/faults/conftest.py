"""Faults with real processes: one live e2bfacade for the package (gunicorn with 4 workers
and the lifecycle worker, its own database and sandbox root) whose runtime carries
failpoints (e2bfacade/failpoints.py). Every point starts disarmed; a test arms one, and it
fires for exactly one operation."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import live_checks as lc
from tests.support.live_fixtures import pytest_runtest_makereport, started  # noqa: F401 - hook
from tests.support.live_server import Deployment, LiveServer, Server

# SIGKILL the process that reaches the point; or raise a runtime error there; or drop the
# database connection there (test_lost_database.py).
KILL_POINTS = ["runtime.pause.after", "runtime.kill.after", "runtime.create.after"]
ERROR_POINTS = ["runtime.pause.before", "runtime.create.before", "runtime.kill.before"]
DBDROP_POINTS = ["after_runtime_create"]


@dataclass
class Failpoints:
    """The markers of E2BFACADE_FAILPOINT_DIR: a point whose marker exists has fired (or is
    disarmed); removing it arms the point for the next operation that reaches it, in any
    process of the server (gunicorn workers, the lifecycle worker)."""

    directory: Path

    def arm(self, point: str) -> None:
        (self.directory / point).unlink(missing_ok=True)

    def fired(self, point: str) -> bool:
        return (self.directory / point).exists()

    def disarm_all(self) -> None:
        for point in KILL_POINTS + ERROR_POINTS + DBDROP_POINTS:
            (self.directory / point).touch()


@pytest.fixture(scope="package")
def failpoints() -> Iterator[Failpoints]:
    directory = Path(tempfile.mkdtemp(prefix="e2bf-fp-", dir="/tmp"))
    points = Failpoints(directory)
    points.disarm_all()
    try:
        yield points
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="package")
def server(failpoints: Failpoints) -> Iterator[LiveServer]:
    spec = ",".join(
        KILL_POINTS + [f"{p}=error" for p in ERROR_POINTS] + [f"{p}=dbdrop" for p in DBDROP_POINTS]
    )
    with started(
        E2BFACADE_FAILPOINTS=spec,
        E2BFACADE_FAILPOINT_DIR=str(failpoints.directory),
        API_RATE_LIMIT="0",
    ) as live:
        yield live


@pytest.fixture(autouse=True)
def _disarmed_after(failpoints: Failpoints) -> Iterator[None]:
    """A test that failed before its point fired must not leave it armed for the next."""
    yield
    failpoints.disarm_all()


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with lc.client(server) as client:
        yield client


@pytest.fixture
def tag() -> str:
    return f"fault-{uuid.uuid4().hex[:12]}"


def create(http: httpx.Client, tag: str) -> str:
    response = http.post(
        "/v2/sandboxes", json={"templateID": "base", "timeout": 600, "metadata": {"tag": tag}}
    )
    assert response.status_code == 201, response.text
    return str(response.json()["sandboxID"])


@pytest.fixture
def cut_deployment() -> Iterator[tuple[Deployment, Server]]:
    """A deployment of its own (one team; a server with its lifecycle worker), for the tests
    that cut the power under it: every process of it may be killed and started again."""
    with Deployment(teams=1, prefix="e2bp") as deployment:
        yield deployment, deployment.server(lifecycle_worker=True)
