"""``code-interpreter-v1`` is a build of the template pipeline: its packages are installed in
a build sandbox (fetched on the host, installed offline there), it is cached by its inputs
(in the database by its inputs' tag, on the host by the image cache), and its build belongs
to no team that holds an API key."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from templates.builds import image_cache
from tests.codeinterpreter.conftest import CiBuild, host_site_packages
from tests.support.live_database import query
from tests.support.live_server import manage

ALIAS = "code-interpreter-v1"


def _builds(build: CiBuild) -> list[tuple[str, str, str]]:
    return [
        (str(r[0]), r[1], r[2])
        for r in query(
            build.server.env["DATABASE_URL"],
            "SELECT build_id, status, image_id FROM templates_templatebuild "
            "WHERE template_id = %s ORDER BY created_at",
            (ALIAS,),
        )
    ]


def _log(build: CiBuild) -> list[str]:
    """The log of the template's builds, in order."""
    return [
        r[0]
        for r in query(
            build.server.env["DATABASE_URL"],
            "SELECT l.message FROM templates_buildlogentry l JOIN templates_templatebuild b "
            "ON l.build_id = b.build_id WHERE b.template_id = %s ORDER BY b.created_at, l.seq",
            (ALIAS,),
        )
    ]


def _image_cache_dir(env: dict[str, str]) -> Path:
    """The server's TEMPLATE_IMAGE_CACHE_DIR, as its settings derive it."""
    if env.get("TEMPLATE_IMAGE_CACHE_DIR"):
        return Path(env["TEMPLATE_IMAGE_CACHE_DIR"])
    return Path(env.get("TEMPLATE_CACHE_DIR") or "/var/cache/e2bfacade") / "images"


def _making_log(build: CiBuild, log: list[str]) -> list[str]:
    """The log of the build that made the template's image: the session's build's own, or,
    when the session's build restored the image from the host's image cache (its inputs
    unchanged since a build on this host), the log the cache keeps of the build that made
    it, which ran every step."""
    said = "Restored from the host's image cache: entry "
    restored = [m for m in log if said in m]
    if not restored:
        return log
    assert not any(m.startswith("[builder ") and "[stdout]" in m for m in log), log[:40]
    entry = restored[0].split(said, 1)[1].split(",", 1)[0]
    return image_cache.read_log(_image_cache_dir(build.server.env) / entry)


def test_code_interpreter_v1_is_built_by_the_template_pipeline_in_a_build_sandbox(
    ci_build: CiBuild,
) -> None:
    builds = _builds(ci_build)
    assert [status for _, status, _ in builds] == ["ready"], builds
    _, _, image_id = builds[0]
    own = _log(ci_build)
    assert own[-1].startswith("Build finished"), own[-5:]
    log = _making_log(ci_build, own)
    # pip ran in the build sandbox, offline, from the wheels the host fetched: its output
    # is the build's, line by line, under the step that ran it.
    assert any(m.startswith("[builder ") and "--no-index" in m for m in log), log[:40]
    installed = [m for m in log if "[stdout]: Successfully installed" in m]
    assert installed and "numpy-" in installed[0] and "ipykernel-" in installed[0], log[-40:]
    (template_image,) = query(
        ci_build.server.env["DATABASE_URL"],
        "SELECT image_id FROM templates_template WHERE template_id = %s",
        (ALIAS,),
    )[0]
    assert template_image == image_id
    # Nothing was installed on the host.
    after = host_site_packages()
    before = ci_build.site_packages_before
    changed = {p for p in after.keys() | before.keys() if after.get(p) != before.get(p)}
    assert not changed, sorted(changed)[:20]


def test_a_second_build_with_the_same_inputs_does_nothing(ci_build: CiBuild) -> None:
    before = _builds(ci_build)
    began = time.monotonic()
    out = manage(ci_build.server.env, "build_code_interpreter", timeout=600)
    took = time.monotonic() - began
    assert f"{ALIAS} is built" in out, out
    assert _builds(ci_build) == before
    assert took < 20, took


def test_no_team_may_see_tag_rebuild_or_delete_the_public_build(ci_build: CiBuild) -> None:
    server = ci_build.server
    ((build_id, _, _),) = _builds(ci_build)
    with httpx.Client(
        base_url=server.url, headers={"X-API-Key": server.api_key}, timeout=60
    ) as http:
        status = http.get(f"/templates/{ALIAS}/builds/{build_id}/status")
        assert status.status_code == 403, status.text
        tagged = http.post("/templates/tags", json={"target": ALIAS, "tags": ["mine"]})
        assert tagged.status_code == 403, tagged.text
        rebuilt = http.post("/v3/templates", json={"name": ALIAS})
        assert rebuilt.status_code == 403, rebuilt.text
        deleted = http.delete(f"/templates/{ALIAS}")
        assert deleted.status_code == 403, deleted.text
        # Every team may start it.
        alias = http.get(f"/templates/aliases/{ALIAS}")
        assert alias.status_code == 200, alias.text
