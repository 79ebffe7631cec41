"""The team's layer cache through the Python SDK: a rebuild whose steps are unchanged runs
none of them, even though only slow steps and the last keep a layer (the hash chain makes
the last step's layer stand for every step before it); a changed start command reruns
only the finalize; ``skip_cache`` reruns everything."""

from __future__ import annotations

import uuid
from pathlib import Path

from e2b import Sandbox, Template, wait_for_file
from e2b.template.main import TemplateFinal

from tests.support.live_server import LiveServer


def template(context: Path, start: str) -> TemplateFinal:
    return (
        Template(file_context_path=str(context))
        .from_template("base")
        .copy("data.txt", "data.txt")
        .run_cmd("cp data.txt copied.txt && echo ran >> /home/user/runs.txt")
        .set_envs({"LAYERED": "yes"})
        .set_start_cmd(f"{start} && sleep 600", wait_for_file("/tmp/started"))
    )


def build(context: Path, name: str, start: str, *, skip_cache: bool = False) -> list[str]:
    """Build (a fresh template object: ``skip_cache`` marks the object forced for good)
    and return the step lines of its log, each ``CACHED …`` or not."""
    logs: list[str] = []
    Template.build(
        template(context, start),
        name,
        cpu_count=1,
        memory_mb=1024,
        skip_cache=skip_cache,
        on_build_logs=lambda entry: logs.append(entry.message),
    )
    return [
        m.removeprefix("CACHED ")[:18] + (" cached" if m.startswith("CACHED ") else "")
        for m in logs
        if m.removeprefix("CACHED ").startswith(("[builder ", "[finalize] Finalizing"))
    ]


def test_an_unchanged_rebuild_runs_no_step_and_a_new_start_command_only_the_finalize(
    envd_env: LiveServer, tmp_path: Path
) -> None:
    (tmp_path / "data.txt").write_text("layered\n")
    name = f"layers-{uuid.uuid4().hex[:8]}"
    first = build(tmp_path, name, "echo a > /tmp/started")
    assert first == [
        "[builder 1/3] COPY",
        "[builder 2/3] RUN ",
        "[builder 3/3] ENV ",
        "[finalize] Finaliz",
    ]
    again = build(tmp_path, name, "echo a > /tmp/started")
    assert again == [f"{line} cached" for line in first]
    new_start = build(tmp_path, name, "echo b > /tmp/started")
    assert new_start == [f"{line} cached" for line in first[:3]] + [first[3]]
    forced = build(tmp_path, name, "echo b > /tmp/started", skip_cache=True)
    assert forced == first

    sandbox = Sandbox.create(name, timeout=120)
    try:
        assert sandbox.files.read("/home/user/copied.txt") == "layered\n"
        # One RUN in the image's lineage: a cached step adds nothing on top of its layer.
        assert sandbox.files.read("/home/user/runs.txt") == "ran\n"
        assert sandbox.commands.run("cat /tmp/started").stdout == "b\n"
        assert sandbox.commands.run('echo "$LAYERED"').stdout == "yes\n"
    finally:
        sandbox.kill()


def test_a_forced_rebuild_keeps_the_files_its_steps_made_anew(envd_env: LiveServer) -> None:
    """``skip_cache`` runs every step again, and what they made is what the template then
    starts: an image of the step's name already existing must not stand in for it."""
    name = f"forced-{uuid.uuid4().hex[:8]}"
    recipe = (
        Template()
        .from_template("base")
        .run_cmd("head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /home/user/nonce.txt")
    )

    def nonce(skip_cache: bool) -> str:
        Template.build(recipe, name, cpu_count=1, memory_mb=512, skip_cache=skip_cache)
        sandbox = Sandbox.create(name, timeout=60)
        try:
            return str(sandbox.files.read("/home/user/nonce.txt"))
        finally:
            sandbox.kill()

    first = nonce(False)
    assert nonce(False) == first  # cached: the same layer
    assert nonce(True) != first  # forced: the step's new output, not the old image
