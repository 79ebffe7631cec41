"""The data plane through the unmodified Python SDK's async client: commands (streamed
callbacks, background, stdin), a terminal (size, input, resize), files. Each test drives
one scenario with ``asyncio.run``, as test_python_sdk_async.py does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from e2b import AsyncSandbox, CommandExitException
from e2b.sandbox.commands.command_handle import PtySize

from tests.support.waiting import eventually_async

pytestmark = pytest.mark.usefixtures("envd_env")
Register = Callable[[str], str]


def run(
    scenario: Callable[[AsyncSandbox], Coroutine[Any, Any, None]], kill_later: Register
) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create()
        kill_later(sandbox.sandbox_id)
        await scenario(sandbox)

    asyncio.run(main())


def test_async_commands_and_files(kill_later: Register) -> None:
    async def scenario(asbx: AsyncSandbox) -> None:
        lines: list[str] = []
        result = await asbx.commands.run("echo a; echo b", on_stdout=lines.append)
        assert result.stdout == "a\nb\n" and "".join(lines) == "a\nb\n"
        await asbx.files.write("/tmp/async.txt", "async")
        assert await asbx.files.read("/tmp/async.txt") == "async"
        with pytest.raises(CommandExitException):
            await asbx.commands.run("exit 7")

    run(scenario, kill_later)


def test_async_stdin(kill_later: Register) -> None:
    async def scenario(asbx: AsyncSandbox) -> None:
        handle = await asbx.commands.run("cat", background=True, stdin=True)
        await asbx.commands.send_stdin(handle.pid, "sent\n")
        await asbx.commands.close_stdin(handle.pid)
        result = await handle.wait()
        assert result.stdout == "sent\n"

    run(scenario, kill_later)


def test_a_terminal_has_its_size_takes_input_and_resizes(kill_later: Register) -> None:
    async def scenario(asbx: AsyncSandbox) -> None:
        seen = bytearray()
        terminal = await asbx.pty.create(PtySize(rows=24, cols=80), on_data=seen.extend)
        await asbx.pty.send_stdin(terminal.pid, b"stty size\n")

        async def printed() -> bytes:
            return bytes(seen)

        await eventually_async(
            printed, until=lambda out: b"24 80" in out, within=10, what="the size printed"
        )
        await asbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
        await asbx.pty.send_stdin(terminal.pid, b"stty size; exit\n")
        await terminal.wait()
        assert b"30 100" in seen

    run(scenario, kill_later)
