"""Template builds keep teams apart: two teams on one live server, the contract team ``A``
and ``B`` (``contract-other``), speaking the raw Template SDK protocol.

E2B's hash chain is public (any team computes another's trigger body from a recipe), so it
may key a team's cache but never name what another team reaches: a layer is the image of
the team that built it, and is reused only for the bytes of the archives it was built from.
And deleting a template removes no image another template still starts from."""

from __future__ import annotations

import contextlib
import io
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from e2bfacade.runtime.local import LocalRuntime
from templates.models import BuildStatus, TemplateBuild
from templates.services import template_delete
from tests.contract.template_support import (
    base_spec,
    copy_step,
    file_link,
    messages,
    q,
    request_build,
    run_step,
    tar_of,
    trigger,
    unique,
    wait_build,
)
from tests.support.factories import TeamFactory, TemplateFactory
from tests.support.live_database import query
from tests.support.live_fixtures import point_sdk, started
from tests.support.live_server import LiveServer
from tests.support.runtime_support import django_runtime, session_sandbox_root

# A RUN that leaves a secret of its own build in the image (what a team's build may well do:
# a generated key, a token fetched at build time).
SECRET_RUN = "head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /secret && chmod 644 /secret"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with started(workers=2) as live:
        yield live


@pytest.fixture(scope="module")
def team_a(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url, headers={"X-API-Key": server.api_key}, timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def team_b(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url, headers={"X-API-Key": server.other_api_key}, timeout=30
    ) as client:
        yield client


@contextlib.contextmanager
def sandbox_of(server: LiveServer, api_key: str, ref: str) -> Iterator[Sandbox]:
    """A sandbox of ``ref`` started by the team of ``api_key`` through the SDK."""
    with pytest.MonkeyPatch.context() as env:
        point_sdk(env, server, api_key)
        sandbox = Sandbox.create(ref, timeout=60)
        try:
            yield sandbox
        finally:
            sandbox.kill()


def build(
    http: httpx.Client, spec: dict[str, Any], *, archive: bytes | None = None, name: str = ""
) -> tuple[str, list[dict[str, Any]]]:
    """Request a template, upload ``archive`` under the files hash of the spec's COPY (when
    given), trigger and wait; returns the template's name and the build's log. Fails the
    test unless the build is ready."""
    name = name or unique("tenancy")
    made = request_build(http, name)
    if archive is not None:
        put_archive(http, made["templateID"], next_files_hash(spec), archive)
    r = trigger(http, made["templateID"], made["buildID"], spec)
    assert r.status_code == 202, r.text
    info, log = wait_build(http, made["templateID"], made["buildID"])
    assert info["status"] == "ready", messages(log)
    return name, log


def next_files_hash(spec: dict[str, Any]) -> str:
    return str(next(s["filesHash"] for s in spec["steps"] if s.get("filesHash")))


def put_archive(http: httpx.Client, template_id: str, files_hash: str, data: bytes) -> None:
    """Store ``data`` as the team's archive of ``files_hash`` (whatever hash it claims)."""
    link = file_link(http, template_id, files_hash)
    put = httpx.put(link["url"], content=data, headers=link["headers"], timeout=30)
    assert put.status_code // 100 == 2, put.text


def app_archive(text: str) -> bytes:
    return tar_of(("file", "app.py", text))


# ------------------------------------------------------------------------------- tests
def test_a_team_that_uploads_its_own_files_under_anothers_hash_does_not_poison_its_build(
    server: LiveServer, team_a: httpx.Client, team_b: httpx.Client
) -> None:
    # A's recipe is public: B computes A's trigger body (the files hash included) from it,
    # stores its own app.py under that hash in its own space, and builds first.
    files_hash = uuid.uuid4().hex * 2
    spec = base_spec(copy_step(files_hash, "app.py", "/home/user/app.py"))
    build(team_b, spec, archive=app_archive("print('B was here')\n"))

    name, log = build(team_a, spec, archive=app_archive("print('A')\n"))
    assert "CACHED [builder 1/1]" not in messages(log)
    with sandbox_of(server, server.api_key, name) as box:
        assert box.files.read("/home/user/app.py") == "print('A')\n"


def test_a_team_building_the_same_recipe_gets_its_own_image_not_the_other_teams_secret(
    server: LiveServer, team_a: httpx.Client, team_b: httpx.Client
) -> None:
    spec = base_spec(run_step(f"{SECRET_RUN} # {uuid.uuid4().hex}"))
    name_a, _ = build(team_a, spec)
    name_b, log_b = build(team_b, spec)
    assert "CACHED [builder 1/1]" not in messages(log_b)
    with sandbox_of(server, server.api_key, name_a) as box:
        secret_a = box.files.read("/secret")
    with sandbox_of(server, server.other_api_key, name_b) as box:
        secret_b = box.files.read("/secret")
    assert len(secret_a) == len(secret_b) == 32
    assert secret_b != secret_a


def test_a_cache_entry_naming_an_image_outside_the_teams_own_is_never_reused(
    server: LiveServer, team_a: httpx.Client, team_b: httpx.Client
) -> None:
    """Cache rows written before images were the team's (or pointed elsewhere by any
    means) name images of no team in particular: they are ignored, never reused."""
    spec = base_spec(run_step(f"{SECRET_RUN} # {uuid.uuid4().hex}"))
    name_a, _ = build(team_a, spec)
    name_b, _ = build(team_b, spec)
    url = server.env["DATABASE_URL"]
    (b_image,) = query(
        url,
        "SELECT t.image_id FROM templates_template t JOIN e2bfacade_team m ON m.id = t.team_id "
        "WHERE t.alias = %s AND m.name = 'contract-other'",
        (name_b,),
    )[0]
    repointed = query(
        url,
        "UPDATE templates_layercacheentry SET image_id = %s WHERE team_id = "
        "(SELECT id FROM e2bfacade_team WHERE name = 'contract') RETURNING id",
        (b_image,),
    )
    assert repointed

    name_again, log = build(team_a, spec)
    assert "CACHED [finalize]" not in messages(log)
    with sandbox_of(server, server.other_api_key, name_b) as box:
        secret_b = box.files.read("/secret")
    with sandbox_of(server, server.api_key, name_again) as box:
        assert box.files.read("/secret") != secret_b


def test_deleting_a_template_leaves_another_teams_template_of_the_same_recipe_startable(
    server: LiveServer, team_a: httpx.Client, team_b: httpx.Client
) -> None:
    spec = base_spec(run_step(f"echo {uuid.uuid4().hex} > /recipe"))
    name_a, _ = build(team_a, spec)
    name_b, _ = build(team_b, spec)
    assert team_b.delete(f"/templates/{q(name_b)}").status_code == 204
    with sandbox_of(server, server.api_key, name_a) as box:
        assert box.commands.run("cat /recipe").exit_code == 0


def test_deleting_one_of_a_teams_two_templates_of_one_recipe_leaves_the_other_startable(
    server: LiveServer, team_a: httpx.Client
) -> None:
    marker = uuid.uuid4().hex
    spec = base_spec(run_step(f"echo {marker} > /recipe"))
    first, _ = build(team_a, spec)
    second, log = build(team_a, spec)
    assert "CACHED [finalize]" in messages(log)  # one image, named by both templates
    assert team_a.delete(f"/templates/{q(first)}").status_code == 204
    with sandbox_of(server, server.api_key, second) as box:
        assert box.files.read("/recipe") == f"{marker}\n"


def test_a_layer_is_reused_only_for_the_same_archive_bytes_under_a_files_hash(
    server: LiveServer, team_a: httpx.Client
) -> None:
    """The files hash is the client's word for what an archive holds; the server cannot
    recompute it for every SDK, so the cache keys on the archive's own digest too: other
    bytes stored under the same hash are copied afresh, never served from the old layer."""
    files_hash = uuid.uuid4().hex * 2
    spec = base_spec(copy_step(files_hash, "app.py", "/home/user/app.py"))
    name = unique("tenancy")
    build(team_a, spec, archive=app_archive("v1\n"), name=name)
    _, log = build(team_a, spec, archive=app_archive("v2\n"), name=name)
    assert "CACHED [builder 1/1]" not in messages(log), messages(log)
    assert "[builder 1/1] COPY app.py /home/user/app.py" in messages(log)
    with sandbox_of(server, server.api_key, name) as box:
        assert box.files.read("/home/user/app.py") == "v2\n"

    # The same bytes again (the SDK uploads an archive only when the server lacks it): the
    # whole build is the cache's.
    _, log = build(team_a, spec, name=name)
    assert "CACHED [builder 1/1] COPY app.py /home/user/app.py" in messages(log)
    assert "CACHED [finalize]" in messages(log)


@pytest.fixture(scope="module")
def sandbox_root() -> Iterator[Path]:
    yield from session_sandbox_root("e2bl-")


@pytest.fixture
def runtime(settings: Any, sandbox_root: Path, db: None) -> Iterator[LocalRuntime]:
    yield from django_runtime(settings, sandbox_root)


def imported_image(runtime: LocalRuntime) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("etc/empty"), io.BytesIO(b""))
    buf.seek(0)
    return runtime.import_image(f"img{uuid.uuid4().hex[:12]}", buf).image_id


def test_a_templates_image_goes_with_it_at_once_only_while_no_build_of_its_team_runs(
    runtime: LocalRuntime,
) -> None:
    """A running build may hold an image it has not recorded yet (a cached layer it just
    took, or a template it starts from): while one of the team's builds runs, a deleted
    template's image is left to the sweep; with none running it goes at once."""
    team = TeamFactory.create()
    builder = TemplateFactory.create(team=team, image_id="")
    running = TemplateBuild.objects.create(template=builder, team=team, status=BuildStatus.BUILDING)
    kept = imported_image(runtime)
    template_delete(team=team, ref=TemplateFactory.create(team=team, image_id=kept).template_id)
    assert kept in runtime.list_images()

    TemplateBuild.objects.filter(pk=running.pk).update(status=BuildStatus.ERROR)
    gone = imported_image(runtime)
    template_delete(team=team, ref=TemplateFactory.create(team=team, image_id=gone).template_id)
    assert gone not in runtime.list_images()
