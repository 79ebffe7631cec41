"""Template builds through the asynchronous Python SDK (``e2b.AsyncTemplate``): it has its
own generated client calls, upload and polling loop, so the user's path is walked again.
Each test drives one scenario with ``asyncio.run`` (no async pytest plugin)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from e2b import AsyncSandbox, AsyncTemplate, BuildException, wait_for_timeout

from tests.contract.template_support import unique
from tests.support.live_server import LiveServer
from tests.support.waiting import eventually_async


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def test_async_build_copy_env_start_and_cached_rebuild(
    envd_env: LiveServer, tmp_path: Path
) -> None:
    token = uuid.uuid4().hex
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.txt").write_text(token)
    template = (
        AsyncTemplate(file_context_path=str(tmp_path))
        .from_template("base")
        .copy("data/f.txt", "/opt/f.txt")
        .run_cmd("test -r /opt/f.txt && echo readable")
        .set_envs({"MODE": "async"})
        .set_start_cmd("echo up > /tmp/up", wait_for_timeout(500))
    )
    name = unique("async-tpl")

    async def scenario() -> None:
        first: list[str] = []
        info = await AsyncTemplate.build(
            template,
            f"{name}:a",
            cpu_count=1,
            memory_mb=512,
            on_build_logs=lambda e: first.append(e.message),
        )
        assert info.tags == ["a"]
        assert any(m.endswith("[stdout]: readable") for m in first), first
        sandbox = await AsyncSandbox.create(f"{name}:a", timeout=60)
        try:
            got = await sandbox.commands.run("cat /opt/f.txt; echo; echo $MODE; cat /tmp/up")
            assert got.stdout == f"{token}\nasync\nup\n"
            owner = await sandbox.commands.run("stat -c %U /opt/f.txt", user="root")
            assert owner.stdout == "user\n"
        finally:
            await sandbox.kill()

        again: list[str] = []
        await AsyncTemplate.build(
            template,
            f"{name}:a",
            cpu_count=1,
            memory_mb=512,
            on_build_logs=lambda e: again.append(e.message),
        )
        steps = [m for m in again if "[builder " in m]
        assert steps and all(m.startswith("CACHED ") for m in steps), again

        assert await AsyncTemplate.exists(name) is True
        assert await AsyncTemplate.exists(unique("free")) is False
        assigned = await AsyncTemplate.assign_tags(f"{name}:a", ["prod", "canary"])
        assert sorted(assigned.tags) == ["canary", "prod"]
        await AsyncTemplate.remove_tags(name, "canary")
        tags = {t.tag for t in await AsyncTemplate.get_tags(name)}
        assert tags == {"a", "prod"}
        with pytest.raises(Exception):  # noqa: B017 - the SDK's generic error
            await AsyncTemplate.assign_tags(f"{name}:a", [":invalid-tag"])

    run(scenario())


def test_async_failures_carry_e2b_texts(sdk_env: LiveServer) -> None:
    async def scenario() -> None:
        bad = AsyncTemplate().from_template("base").run_cmd("exit 7")
        with pytest.raises(BuildException) as raised:
            await AsyncTemplate.build(bad, unique("abad"), cpu_count=1, memory_mb=512)
        assert str(raised.value) == "failed to run command 'exit 7': exit status 7"

        nobody = AsyncTemplate().from_template("base").run_cmd("whoami", user="root123")
        with pytest.raises(BuildException) as raised:
            await AsyncTemplate.build(nobody, unique("abad"), cpu_count=1, memory_mb=512)
        assert str(raised.value) == (
            "failed to run command 'whoami': command failed: unauthenticated: "
            "invalid username: 'root123'"
        )

    run(scenario())


def test_async_background_build_is_building_at_once(sdk_env: LiveServer) -> None:
    async def scenario() -> None:
        template = AsyncTemplate().from_template("base").run_cmd(f"sleep 1; echo {uuid.uuid4()}")
        info = await AsyncTemplate.build_in_background(
            template, unique("abg"), cpu_count=1, memory_mb=512
        )
        status = await AsyncTemplate.get_build_status(info)
        assert status.status.value == "building"
        status = await eventually_async(
            lambda: AsyncTemplate.get_build_status(info),
            until=lambda status: status.status.value != "building",
            within=120,
            every=0.2,
            what="the build to end",
        )
        assert status.status.value == "ready", status

    run(scenario())
