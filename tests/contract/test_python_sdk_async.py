"""The asynchronous Python SDK (``e2b.AsyncSandbox``) against a live server.

Each test drives one scenario with ``asyncio.run``, so the suite needs no async pytest
plugin. The async SDK has its own generated client calls, paginator and error handling, so
every route is exercised again through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    NotFoundException,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from tests.support.live_server import LiveServer

SLACK = timedelta(seconds=3)
Register = Callable[[str], str]


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


async def create(kill_later: Register, **kwargs: Any) -> AsyncSandbox:
    kwargs.setdefault("timeout", 120)
    sandbox = await AsyncSandbox.create(**kwargs)
    kill_later(sandbox.sandbox_id)
    return sandbox


async def list_all(query: SandboxQuery, **kwargs: Any) -> list[str]:
    paginator = AsyncSandbox.list(query=query, **kwargs)
    ids: list[str] = []
    while paginator.has_next:
        ids += [s.sandbox_id for s in await paginator.next_items()]
    return ids


def test_async_create_get_info_and_kill_round_trip(
    sdk_env: LiveServer, kill_later: Register, tag: str
) -> None:
    async def scenario() -> None:
        sandbox = await create(kill_later, timeout=75, metadata={"tag": tag}, envs={"A": "1"})

        info = await sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id
        assert info.template_id == "base"
        assert info.state == SandboxState.RUNNING
        assert info.metadata == {"tag": tag}
        assert (info.end_at - info.started_at).total_seconds() == pytest.approx(75, abs=1)
        assert await AsyncSandbox.get_info(sandbox.sandbox_id) == info

        assert await sandbox.kill() is True
        assert await AsyncSandbox.kill(sandbox.sandbox_id) is False
        with pytest.raises(NotFoundException):
            await AsyncSandbox.get_info(sandbox.sandbox_id)

    run(scenario())


def test_async_create_defaults_to_the_base_template_for_300_seconds(
    sdk_env: LiveServer, kill_later: Register
) -> None:
    async def scenario() -> None:
        sandbox = await AsyncSandbox.create()
        kill_later(sandbox.sandbox_id)

        info = await sandbox.get_info()
        assert info.template_id == "base"
        assert (info.end_at - info.started_at).total_seconds() == pytest.approx(300, abs=1)

    run(scenario())


def test_async_create_errors_map_to_sdk_exceptions(sdk_env: LiveServer) -> None:
    async def scenario() -> None:
        with pytest.raises(SandboxException) as unknown:
            await AsyncSandbox.create("no-such-template-async", timeout=30)
        assert unknown.value.status_code == 404
        assert "no-such-template-async" in str(unknown.value)

        with pytest.raises(SandboxException) as too_long:
            await AsyncSandbox.create(timeout=sdk_env.max_timeout * 2)
        assert too_long.value.status_code == 400

        with pytest.raises(AuthenticationException):
            await AsyncSandbox.create(timeout=30, api_key="e2b_" + "1" * 40)

    run(scenario())


def test_async_connect_extends_a_running_sandbox_and_resumes_a_paused_one(
    sdk_env: LiveServer, kill_later: Register
) -> None:
    async def scenario() -> None:
        sandbox = await create(kill_later, timeout=600)
        end_at = (await sandbox.get_info()).end_at

        same = await AsyncSandbox.connect(sandbox.sandbox_id, timeout=30)
        assert same.sandbox_id == sandbox.sandbox_id
        assert (await same.get_info()).end_at == end_at  # never shortened

        assert await sandbox.pause() is True
        assert await AsyncSandbox.pause(sandbox.sandbox_id) is False
        assert (await sandbox.get_info()).state == SandboxState.PAUSED

        requested = datetime.now(UTC) + timedelta(seconds=200)
        resumed = await AsyncSandbox.connect(sandbox.sandbox_id, timeout=200)
        info = await resumed.get_info()
        assert info.state == SandboxState.RUNNING
        assert abs(info.end_at - requested) <= SLACK

        await sandbox.kill()
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.connect(sandbox.sandbox_id)

    run(scenario())


def test_async_list_pages_through_every_sandbox_exactly_once_newest_first(
    sdk_env: LiveServer, kill_later: Register, tag: str
) -> None:
    async def scenario() -> None:
        # One at a time: concurrent creates could share a start time, and the order of
        # equal start times is the server's choice.
        created = [(await create(kill_later, metadata={"tag": tag})).sandbox_id for _ in range(5)]

        paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2)
        pages = []
        while paginator.has_next:
            pages.append(await paginator.next_items())

        assert [len(page) for page in pages] == [2, 2, 1]
        assert [s.sandbox_id for page in pages for s in page] == created[::-1]

        assert await AsyncSandbox.pause(created[0]) is True
        assert await list_all(SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED])) == [
            created[0]
        ]
        running = await list_all(SandboxQuery(metadata={"tag": tag}, state=[SandboxState.RUNNING]))
        assert sorted(running) == sorted(created[1:])

    run(scenario())


def test_async_set_timeout_shortens_and_lengthens_the_end_time(
    sdk_env: LiveServer, kill_later: Register
) -> None:
    async def scenario() -> None:
        sandbox = await create(kill_later, timeout=600)

        requested = datetime.now(UTC) + timedelta(seconds=20)
        await sandbox.set_timeout(20)
        assert abs((await sandbox.get_info()).end_at - requested) <= SLACK

        requested = datetime.now(UTC) + timedelta(seconds=700)
        await AsyncSandbox.set_timeout(sandbox.sandbox_id, 700)
        assert abs((await sandbox.get_info()).end_at - requested) <= SLACK

        with pytest.raises(SandboxException) as too_long:
            await sandbox.set_timeout(sdk_env.max_timeout + 1)
        assert too_long.value.status_code == 400

    run(scenario())


def test_async_get_metrics_returns_a_sample_with_cpu_and_memory(
    sdk_env: LiveServer, kill_later: Register
) -> None:
    async def scenario() -> None:
        sandbox = await create(kill_later)

        metrics = await sandbox.get_metrics()
        assert metrics
        assert metrics[-1].cpu_count > 0
        assert metrics[-1].mem_total > 0

    run(scenario())


def test_async_another_team_gets_not_found_for_our_sandbox(
    sdk_env: LiveServer, kill_later: Register
) -> None:
    other_key = sdk_env.other_api_key

    async def scenario() -> None:
        sandbox = await create(kill_later)
        sandbox_id = sandbox.sandbox_id

        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.get_info(sandbox_id, api_key=other_key)
        assert await AsyncSandbox.kill(sandbox_id, api_key=other_key) is False
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.pause(sandbox_id, api_key=other_key)
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.connect(sandbox_id, api_key=other_key)
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.set_timeout(sandbox_id, 5, api_key=other_key)
        assert sandbox_id not in await list_all(SandboxQuery(), api_key=other_key)

        assert (await sandbox.get_info()).state == SandboxState.RUNNING

    run(scenario())
