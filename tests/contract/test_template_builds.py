"""Template builds through the unmodified Python SDK (``e2b.Template``), sync, against the
live server: what a user builds is what a sandbox of it runs (files, owner, env, workdir,
start command), the layer cache and ``skip_cache``, background builds, E2B's failure texts,
names and tags. One build is made per module and every read-only check reuses it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import BuildException, PtySize, Sandbox, Template, wait_for_timeout

from tests.contract.template_support import q, request_build, unique
from tests.support.live_fixtures import point_sdk
from tests.support.live_server import LiveServer
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def sdk(live_server_e2b: LiveServer) -> Iterator[LiveServer]:
    with pytest.MonkeyPatch.context() as env:
        point_sdk(env, live_server_e2b, live_server_e2b.api_key)
        yield live_server_e2b


def _template(context: Path, token: str) -> Any:
    (context / "folder" / "sub").mkdir(parents=True)
    (context / "folder" / "a.txt").write_text(f"alpha {token}\n")
    (context / "folder" / "sub" / "b.txt").write_text("beta\n")
    return (
        Template(file_context_path=str(context))
        .from_template("base")
        .copy("folder/*", "folder")
        .run_cmd("cat folder/a.txt")
        .set_envs({"GREETING": "hi $HOME", "PLAIN": "one two"})
        .set_workdir("/app")
        .set_start_cmd("echo started > /tmp/started && pwd > /tmp/start-cwd", wait_for_timeout(500))
    )


class Built:
    def __init__(self, name: str, template: Any, token: str) -> None:
        self.name, self.template, self.token = name, template, token
        self.logs: list[str] = []
        self.info: Any = None


@pytest.fixture(scope="module")
def built(sdk: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Built:
    token = uuid.uuid4().hex
    name = unique("sdk-tpl")
    out = Built(name, _template(tmp_path_factory.mktemp("ctx"), token), token)
    out.info = Template.build(
        out.template,
        f"{name}:v1",
        cpu_count=1,
        memory_mb=512,
        on_build_logs=lambda e: out.logs.append(e.message),
    )
    return out


@pytest.fixture(scope="module")
def box(built: Built) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(f"{built.name}:v1", timeout=120)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def _sh(box: Sandbox, cmd: str, user: str = "user") -> str:
    return str(box.commands.run(cmd, user=user).stdout).strip()


# --------------------------------------------------------------------- what was built
def test_a_fresh_build_runs_every_step_and_prints_the_copied_file(built: Built) -> None:
    assert built.info.name == f"{built.name}:v1"
    assert built.info.tags == ["v1"]
    text = "\n".join(built.logs)
    assert f"alpha {built.token}" in text  # the RUN's output, through the log
    assert not any(line.startswith("CACHED [builder") for line in built.logs), text


def test_the_copied_files_are_in_the_sandbox_and_owned_by_user(box: Sandbox, built: Built) -> None:
    assert _sh(box, "cat /home/user/folder/a.txt") == f"alpha {built.token}"
    assert _sh(box, "cat /home/user/folder/sub/b.txt") == "beta"
    owners = _sh(box, "stat -c %U:%G /home/user/folder /home/user/folder/sub/b.txt", "root")
    assert owners.split() == ["user:user", "user:user"]


def test_envs_workdir_and_start_command_reach_every_sandbox(box: Sandbox) -> None:
    # E2B expands an ENV value once, at build time, in root's login environment.
    assert _sh(box, 'printf "%s|%s" "$GREETING" "$PLAIN"') == "hi /root|one two"
    assert _sh(box, "stat -c %U /app", "root") == "user"
    assert _sh(box, "cat /tmp/started") == "started"
    assert _sh(box, "cat /tmp/start-cwd") == "/app"


def test_commands_start_in_the_templates_final_workdir(box: Sandbox) -> None:
    # envd's default: the template's last WORKDIR, for commands and terminals alike; a
    # command's own cwd and a file's relative path are unchanged (home).
    assert _sh(box, "pwd") == "/app"
    assert _sh(box, "pwd", "root") == "/app"
    assert str(box.commands.run("pwd", cwd="/tmp").stdout).strip() == "/tmp"
    terminal = box.pty.create(PtySize(rows=24, cols=80))
    box.pty.send_stdin(terminal.pid, b"pwd; exit\n")
    output: list[bytes] = []
    terminal.wait(on_pty=output.append)
    assert b"/app" in b"".join(output)
    box.files.write("relative.txt", "here")
    assert _sh(box, "cat /home/user/relative.txt") == "here"


def test_an_unchanged_rebuild_is_all_cached(built: Built) -> None:
    logs: list[str] = []
    info = Template.build(
        built.template,
        f"{built.name}:v1",
        cpu_count=1,
        memory_mb=512,
        on_build_logs=lambda e: logs.append(e.message),
    )
    assert info.build_id != built.info.build_id
    steps = [m for m in logs if "[builder " in m]
    assert steps and all(m.startswith("CACHED ") for m in steps), logs
    assert any(m.startswith("CACHED [finalize]") for m in logs), logs


def test_skip_cache_runs_every_step_again(built: Built) -> None:
    logs: list[str] = []
    Template.build(
        built.template,
        f"{built.name}:fresh",
        cpu_count=1,
        memory_mb=512,
        skip_cache=True,
        on_build_logs=lambda e: logs.append(e.message),
    )
    text = "\n".join(logs)
    assert "CACHED" not in text, text
    assert f"alpha {built.token}" in text


def test_a_background_build_is_building_at_once_then_ready(sdk: LiveServer) -> None:
    template = Template().from_template("base").run_cmd(f"sleep 2; echo {uuid.uuid4().hex}")
    info = Template.build_in_background(template, unique("bg"), cpu_count=1, memory_mb=512)
    first = Template.get_build_status(info)
    assert first.status.value == "building", first
    assert first.reason is None
    now = eventually(
        lambda: Template.get_build_status(info, logs_offset=0),
        until=lambda status: status.status.value != "building",
        within=120,
        every=0.2,
        what="the build to end",
    )
    assert now.status.value == "ready", now
    assert any("sleep 2" in e.message for e in now.log_entries)


# --------------------------------------------------------------------------- failures
def test_a_failing_run_raises_e2b_text_at_its_step(sdk: LiveServer) -> None:
    bad = Template().from_template("base").run_cmd("echo hi").run_cmd("exit 3")
    with pytest.raises(BuildException) as raised:
        Template.build(bad, unique("bad"), cpu_count=1, memory_mb=512)
    assert str(raised.value) == "failed to run command 'exit 3': exit status 3"


def test_the_failing_step_is_named_in_the_status_reason(sdk: LiveServer) -> None:
    bad = Template().from_template("base").run_cmd("true").run_cmd("false")
    info = Template.build_in_background(bad, unique("bad"), cpu_count=1, memory_mb=512)
    status = eventually(
        lambda: Template.get_build_status(info),
        until=lambda status: status.status.value == "error",
        within=120,
        every=0.2,
        what="the build to fail",
    )
    assert status.reason is not None
    assert status.reason.message == "failed to run command 'false': exit status 1"
    assert status.reason.step == "2"


def test_an_unknown_user_fails_with_envd_text(sdk: LiveServer) -> None:
    bad = Template().from_template("base").run_cmd("whoami", user="root123")
    with pytest.raises(BuildException) as raised:
        Template.build(bad, unique("bad"), cpu_count=1, memory_mb=512)
    assert str(raised.value) == (
        "failed to run command 'whoami': command failed: unauthenticated: "
        "invalid username: 'root123'"
    )


# ------------------------------------------------------------------------------ names
def test_exists_is_true_for_own_base_and_other_team_names_false_for_free_ones(
    built: Built, live_server_e2b: LiveServer, other_http: httpx.Client, http: httpx.Client
) -> None:
    theirs = unique("theirs")
    request_build(other_http, theirs)
    assert http.get(f"/templates/aliases/{q(theirs)}").status_code == 403
    assert http.get(f"/templates/aliases/{q(built.name)}").status_code == 200
    assert http.get(f"/templates/aliases/{unique('free')}").status_code == 404
    assert Template.exists(built.name) is True
    assert Template.exists("base") is True
    assert Template.exists(theirs) is True  # 403: taken, by someone else
    assert Template.alias_exists(unique("free")) is False


# ------------------------------------------------------------------------------- tags
def test_tags_assign_list_and_single_then_remove(built: Built) -> None:
    v1 = {t.tag: t.build_id for t in Template.get_tags(built.name)}["v1"]
    assigned = Template.assign_tags(f"{built.name}:v1", ["production", "latest"])
    assert sorted(assigned.tags) == ["latest", "production"]
    assert assigned.build_id == v1
    single = Template.assign_tags(f"{built.name}:v1", "stable")
    assert single.tags == ["stable"]
    tags = {t.tag: t.build_id for t in Template.get_tags(built.name)}
    assert {"v1", "production", "latest", "stable"} <= set(tags)
    assert tags["production"] == v1

    Template.remove_tags(built.name, ["latest"])
    after = {t.tag for t in Template.get_tags(built.name)}
    assert "latest" not in after and "production" in after

    sandbox = Sandbox.create(f"{built.name}:production", timeout=60)
    try:
        assert sandbox.commands.run("cat /tmp/started").stdout == "started\n"
    finally:
        sandbox.kill()


@pytest.mark.parametrize("bad", [":invalid-tag", "e2b-tags-test:"])
def test_invalid_tags_are_refused(built: Built, bad: str) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the SDK raises its generic error
        Template.assign_tags(f"{built.name}:v1", [bad])
    assert bad.strip(":") not in {t.tag for t in Template.get_tags(built.name)}


def test_the_default_tag_cannot_be_removed(built: Built, http: httpx.Client) -> None:
    Template.build(
        built.template, built.name, cpu_count=1, memory_mb=512
    )  # cached: makes `default`
    with pytest.raises(Exception):  # noqa: B017
        Template.remove_tags(built.name, ["default"])
    assert "default" in {t.tag for t in Template.get_tags(built.name)}
    r = http.request("DELETE", "/templates/tags", json={"name": built.name, "tags": ["default"]})
    assert r.status_code == 400, r.text
