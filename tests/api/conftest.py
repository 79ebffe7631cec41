"""Fixtures for the Django-level API tests: DRF's APIClient against the real local runtime.

One runtime per test session lives on a fresh, short ``SANDBOX_ROOT`` under /tmp (it holds
the launcher's unix socket, whose path must stay under 108 bytes). Every test points
``settings.SANDBOX_ROOT`` at it (``get_runtime()`` caches one runtime per root) and, when it
ends, every sandbox in that root is killed and every image but ``base`` deleted, so tests
never see each other's sandboxes. Nothing of the runtime is mocked.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team
from sandboxes import services
from sandboxes.runtime import get_runtime
from sandboxes.runtime.base import ImageInUse, RuntimeUnavailable
from sandboxes.runtime.local import BASE_IMAGE, LocalRuntime
from templates.models import Template
from tests.factories import ApiKeyFactory, TeamFactory


def _daemon_pids(root: Path) -> list[int]:
    """The sandboxd launchers this session started for ``root`` (found by their socket path)."""
    prefix = str(root / "run").encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:2] == [b"daemon"] and len(argv) > 2 and argv[2].startswith(prefix):
            pids.append(int(entry))
    return pids


def _kill_everything(rt: LocalRuntime) -> None:
    """Kill every sandbox of ``rt`` and delete every image but base (children first)."""
    ids = {p.name for p in (rt.root / "sandboxes").iterdir() if not p.name.startswith(".")}
    for sandbox_id in ids | rt.cgroups.list_ids():
        rt.kill(sandbox_id)
    rt.reap_orphans()
    images = [i for i in rt.list_images() if i != BASE_IMAGE]
    while images:
        left = []
        for image_id in images:
            try:
                rt.delete_image(image_id)
            except ImageInUse:
                left.append(image_id)
        if len(left) == len(images):
            raise AssertionError(f"images still in use after every sandbox was killed: {left}")
        images = left


@pytest.fixture(scope="session")
def sandbox_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="/tmp/e2ba-"))
    yield root
    # Tear down what this session made: sandboxes, the launcher daemon, the cgroup parents.
    try:
        rt = LocalRuntime(root)
    except RuntimeUnavailable:
        shutil.rmtree(root, ignore_errors=True)
        return
    _kill_everything(rt)
    for pid in _daemon_pids(root):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # it is our child (started by ensure_daemon): reap it
        except (ProcessLookupError, ChildProcessError):
            pass
    parents = (
        list(rt.cgroups.roots.values())  # type: ignore[attr-defined]
        if rt.cgroups.version == 1
        else [rt.cgroups.root]  # type: ignore[attr-defined]
    )
    for parent in parents:
        try:
            parent.rmdir()
        except OSError:
            pass
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def runtime(settings: Any, sandbox_root: Path, db: None) -> Iterator[LocalRuntime]:
    """The real local runtime every API call of the test uses; emptied when the test ends."""
    settings.SANDBOX_ROOT = sandbox_root
    try:
        rt = get_runtime()
    except RuntimeUnavailable as exc:
        pytest.skip(f"the local runtime cannot run here: {exc.message}")
    assert isinstance(rt, LocalRuntime)
    # The public base template comes from a data migration; a transactional test's flush
    # deletes it, so make sure it is there for every test.
    Template.objects.get_or_create(
        template_id="base", defaults={"alias": "base", "image_id": BASE_IMAGE, "team": None}
    )
    yield rt
    _kill_everything(rt)


@pytest.fixture
def other_team() -> Team:
    return TeamFactory.create()


@pytest.fixture
def other_api_key(other_team: Team) -> ApiKey:
    return ApiKeyFactory.create(team=other_team)


@pytest.fixture
def other_client(other_api_key: ApiKey) -> APIClient:
    """A client of another team: it must never see or touch ``team``'s resources."""
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=other_api_key.raw)  # type: ignore[attr-defined]
    return client


@pytest.fixture
def create_sandbox(api_client: APIClient) -> Callable[..., dict[str, Any]]:
    """``create_sandbox(**body)``: POST /v2/sandboxes (templateID base unless given) and
    return the 201 body."""

    def create(client: APIClient | None = None, **fields: Any) -> dict[str, Any]:
        response = (client or api_client).post(
            "/v2/sandboxes", {"templateID": "base", **fields}, format="json"
        )
        assert response.status_code == 201, response.content
        return response.json()  # type: ignore[no-any-return]

    return create


@pytest.fixture
def fast_transition_wait(monkeypatch: pytest.MonkeyPatch) -> float:
    """Shorten how long a caller waits out another transition before answering 409."""
    monkeypatch.setattr(services, "TRANSITION_WAIT_SECONDS", 0.3)
    return 0.3
