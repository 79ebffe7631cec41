"""Fixtures for the Django-level idempotency tests: DRF's APIClient against the real local
runtime on a short temporary ``SANDBOX_ROOT`` (its launcher socket path must stay under 108
bytes). Every sandbox a test made is killed when it ends. Nothing of the runtime is mocked;
the only fault injected in-process is :func:`crash_at`, which stands in for a process dying
at one of the failpoints (the real-process tests kill real gunicorn workers instead).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team
from idempotency import services as idempotency_services
from sandboxes import services as sandbox_services
from sandboxes.runtime import get_runtime
from sandboxes.runtime.base import ImageInUse, RuntimeUnavailable
from sandboxes.runtime.local import BASE_IMAGE, LocalRuntime
from templates.models import Template
from tests.factories import ApiKeyFactory, TeamFactory


class Crash(BaseException):
    """Stands in for the process dying: a BaseException, so no ``except Exception`` on the
    way up handles it, exactly as nothing runs after a SIGKILL (``finally`` blocks aside)."""


def _daemon_pids(root: Path) -> list[int]:
    """Every helper process serving ``root`` (the sandboxd listener and its keeper, whatever
    they call themselves): any process whose command line names a socket under it."""
    prefix = str(root / "run" / "sandboxd-").encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(prefix in arg for arg in argv):
            pids.append(int(entry))
    return pids


def kill_everything(rt: LocalRuntime) -> None:
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
    root = Path(tempfile.mkdtemp(prefix="e2bi-", dir="/tmp"))
    yield root
    try:
        rt = LocalRuntime(root)
    except RuntimeUnavailable:
        shutil.rmtree(root, ignore_errors=True)
        return
    kill_everything(rt)
    for pid in _daemon_pids(root):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # our child (started by the runtime's ensure_daemon): reap it
        except (ProcessLookupError, ChildProcessError):
            pass
    cg: Any = rt.cgroups
    for parent in list(cg.roots.values()) if cg.version == 1 else [cg.root]:
        try:
            parent.rmdir()
        except OSError:
            pass
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
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
    kill_everything(rt)


@pytest.fixture
def other_team(db: None) -> Team:
    return TeamFactory.create()


@pytest.fixture
def other_client(other_team: Team) -> APIClient:
    key: ApiKey = ApiKeyFactory.create(team=other_team)
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=key.raw)  # type: ignore[attr-defined]
    return client


@pytest.fixture
def key() -> str:
    """A fresh, valid Idempotency-Key (a lowercase UUID, as the contract suggests)."""
    return str(uuid.uuid4())


PostFn = Callable[..., Any]


@pytest.fixture
def post(api_client: APIClient) -> PostFn:
    """``post(body, key=None, path="/v2/sandboxes", client=api_client)``: a JSON create,
    with the ``Idempotency-Key`` header when ``key`` is given. ``body`` may be a dict or
    raw JSON text (sent byte for byte)."""

    def send(
        body: dict[str, Any] | str,
        key: str | None = None,
        path: str = "/v2/sandboxes",
        client: APIClient | None = None,
    ) -> Any:
        headers = {} if key is None else {"Idempotency-Key": key}
        c = client or api_client
        if isinstance(body, str):
            return c.post(path, data=body, content_type="application/json", headers=headers)
        return c.post(path, body, format="json", headers=headers)

    return send


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``crash_at(point)``: the next request that reaches failpoint ``point`` dies there
    (raises :class:`Crash`), once. Points: after_claim, after_runtime_create,
    before_complete, after_complete."""

    def arm(point: str) -> None:
        fired: list[str] = []

        def failpoint(name: str) -> None:
            if name == point and not fired:
                fired.append(name)
                raise Crash(name)

        # Each module bound the name at import: patch both places that call it.
        monkeypatch.setattr(idempotency_services, "failpoint", failpoint)
        monkeypatch.setattr(sandbox_services, "failpoint", failpoint)

    return arm


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "live_server: starts real gunicorn servers on a fresh PostgreSQL database (part of "
        "the default run and of CI; deselect with -m 'not live_server' for a quick loop)",
    )
