"""The kernels behind the Code Interpreter's execution service (e2b_execution_server.py,
beside this file): a context is one kernel, a Jupyter one (Python, R, bash) through
jupyter_client or a Node.js one (JavaScript, TypeScript: e2b_js_kernel.mjs), running one
execution at a time; :class:`Contexts` holds them, and a default one per language.

The sandbox's environment variables (those given at create) come from the process's own
environment and, when the runtime rewrites it, from ``$E2B_ENV_FILE`` (a JSON object): a
sandbox taken from a warm pool gets its create's variables that way. Each kernel receives
changes before its next execution; per-call ``env_vars`` hold for that execution only.

This file is not imported by the control plane: it is copied into the template's image.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import queue
import shlex
import signal
import uuid
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import AsyncKernelManager

log = logging.getLogger("e2b-execution")

ENV_FILE = os.environ.get("E2B_ENV_FILE", "")
DEFAULT_CWD = os.environ.get("E2B_DEFAULT_CWD", "/home/user")
KEEPALIVE_S = 5.0
KERNEL_START_TIMEOUT_S = 60.0
# E2B's language names, and what the SDKs send for them.
LANGUAGE_ALIASES = {
    "python": "python",
    "python3": "python",
    "py": "python",
    "bash": "bash",
    "sh": "bash",
    "shell": "bash",
    "r": "r",
    "javascript": "javascript",
    "js": "javascript",
    "typescript": "typescript",
    "ts": "typescript",
}
# The kernelspec of each language this template has (see its build).
KERNELS = {"python": "python3", "r": "r", "bash": "bash"}
# JavaScript and TypeScript: e2b_js_kernel.mjs, beside this file, on the guest's Node.js.
NODE = os.environ.get("E2B_NODE", "node")
JS_KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2b_js_kernel.mjs")
# Languages E2B's own template serves that this one does not: asked for by name, they get
# an explicit error instead of a Python kernel.
UNSUPPORTED = {"java", "deno"}
AVAILABLE = "python, javascript, typescript, r and bash are"
MIME_KEYS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def normalize_language(language: str | None) -> str:
    name = (language or "python").strip().lower()
    if name in LANGUAGE_ALIASES:
        return LANGUAGE_ALIASES[name]
    if name in UNSUPPORTED:
        raise RequestError(
            400, f"language {language!r} is not available in this template ({AVAILABLE})"
        )
    raise RequestError(400, f"unknown language {language!r} ({AVAILABLE} available)")


def read_env_file() -> dict[str, str]:
    if not ENV_FILE:
        return {}
    try:
        with open(ENV_FILE, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items()}


def env_code(language: str, values: dict[str, str | None]) -> str:
    """Code that sets (value) or unsets (None) environment variables in a kernel."""
    if language == "python":
        return (
            "import os as __e2b_os\n"
            f"for __e2b_k, __e2b_v in {values!r}.items():\n"
            "    if __e2b_v is None: __e2b_os.environ.pop(__e2b_k, None)\n"
            "    else: __e2b_os.environ[__e2b_k] = __e2b_v\n"
            "del __e2b_os, __e2b_k, __e2b_v\n"
        )
    if language == "r":
        calls = [
            f"Sys.unsetenv({_r_string(k)})"
            if v is None
            else f"Sys.setenv({_r_string(k)} = {_r_string(v)})"
            for k, v in values.items()
        ]
        return f"invisible(c({', '.join(calls)}))\n"
    lines = [
        f"unset {shlex.quote(k)}" if v is None else f"export {shlex.quote(k)}={shlex.quote(v)}"
        for k, v in values.items()
    ]
    return "\n".join(lines) or ":"


def _r_string(text: str) -> str:
    r"""``text`` as an R string literal. JSON's escapes (\", \\, \n, \t, \uXXXX for the other
    control characters) mean the same in R; every other character is written as itself,
    since R reads no surrogate pairs (``\ud83d\ude00``)."""
    return json.dumps(text, ensure_ascii=False)


def result_item(content: dict[str, Any], main: bool) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, value in (content.get("data") or {}).items():
        key = MIME_KEYS.get(mime)
        if key is None:
            extra[mime] = value
            continue
        if key == "text" and isinstance(value, str) and len(value) >= 2:
            # A string's repr: the SDKs show the string itself, as E2B's server does.
            if value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
        item[key] = value
    item["extra"] = extra
    return item


class Output:
    """Where an execution's items go (the /execute response); ``gone`` once its client
    hung up."""

    gone: bool

    async def emit(self, item: dict[str, Any]) -> None:
        raise NotImplementedError


@dataclass
class Context:
    """A context: one kernel, one execution at a time (``lock``)."""

    id: str
    language: str
    cwd: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    env_applied: dict[str, str] = field(default_factory=dict)
    env_started: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def kernel_env(self) -> dict[str, str]:
        self.env_applied = self.env_started = read_env_file()
        env = {**os.environ, **self.env_applied}
        env.pop("E2B_EXECUTION_PORT", None)
        return env

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def restart(self) -> None:
        async with self.lock:
            await self.restart_locked()

    async def restart_locked(self) -> None:
        raise NotImplementedError

    async def alive(self) -> bool:
        raise NotImplementedError

    async def revive(self) -> bool:
        """Start the kernel again if it died (``exit()`` in a cell, killed, out of memory),
        as Jupyter's server does; True when it had to. Caller holds the lock."""
        if await self.alive():
            return False
        await self.restart_locked()
        return True

    async def set_env(self, values: dict[str, str | None]) -> None:
        raise NotImplementedError

    async def execute(self, code: str, out: Output) -> None:
        raise NotImplementedError

    async def sync_env(self) -> None:
        """Give the kernel the sandbox's env vars where they changed since it started (a
        warm pool sandbox's claim writes them to E2B_ENV_FILE)."""
        wanted = read_env_file()
        if wanted == self.env_applied or not ENV_FILE:
            return
        change: dict[str, str | None] = {k: v for k, v in wanted.items()}
        for gone in set(self.env_applied) - set(wanted):
            change[gone] = os.environ.get(gone)
        await self.set_env(change)
        self.env_applied = wanted


@dataclass
class JupyterContext(Context):
    """A Jupyter kernel (Python, bash), through jupyter_client."""

    manager: Any = None
    client: Any = None
    pending: asyncio.Future[Any] | None = None

    async def start(self) -> None:
        self.manager = AsyncKernelManager(kernel_name=KERNELS[self.language])
        await self.manager.start_kernel(cwd=self.cwd, env=self.kernel_env())
        self.client = self.manager.client()
        self.client.start_channels()
        await self.client.wait_for_ready(timeout=KERNEL_START_TIMEOUT_S)

    async def stop(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
        with contextlib.suppress(Exception):
            await self.manager.shutdown_kernel(now=True)

    async def restart_locked(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None
        # A new kernel process on the same ports, with the environment it started with.
        await self.manager.restart_kernel(now=True)
        self.env_applied = self.env_started
        await self.client.wait_for_ready(timeout=KERNEL_START_TIMEOUT_S)

    async def alive(self) -> bool:
        return bool(self.manager.has_kernel and await self.manager.is_alive())

    async def next_iopub(self, timeout: float) -> dict[str, Any] | None:
        """The kernel's next broadcast message, or None after ``timeout`` seconds (the
        read stays pending for the next call, so no message is lost)."""
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.client.get_iopub_msg())
        done, _ = await asyncio.wait({self.pending}, timeout=timeout)
        if not done:
            return None
        fut, self.pending = self.pending, None
        return fut.result()  # type: ignore[no-any-return]

    async def reply(self, msg_id: str) -> None:
        """Consume the kernel's reply to ``msg_id`` on the shell channel."""
        while True:
            try:
                msg = await self.client.get_shell_msg(timeout=KERNEL_START_TIMEOUT_S)
            except queue.Empty:
                return
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return

    async def set_env(self, values: dict[str, str | None]) -> None:
        """Run set-up code: no output, no execution count, nothing in the history."""
        msg_id = self.client.execute(env_code(self.language, values), silent=True)
        await self.reply(msg_id)

    async def execute(self, code: str, out: Output) -> None:
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False)
        interrupted = False
        error_sent = False
        while True:
            if out.gone and not interrupted:
                # The client hung up (seen at the latest by the next keepalive's write):
                # stop the code, as a user pressing Ctrl-C would; the kernel stays.
                interrupted = True
                with contextlib.suppress(Exception):
                    await self.manager.interrupt_kernel()
            msg = await self.next_iopub(KEEPALIVE_S)
            if msg is None:
                if not await self.alive():
                    await out.emit(_error("KernelDied", "the kernel exited", ""))
                    return  # no reply will come
                await out.emit({"type": "keepalive"})
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            content = msg["content"]
            stamp = msg["header"].get("date")
            timestamp = stamp.isoformat() if hasattr(stamp, "isoformat") else str(stamp or "")
            if kind == "execute_input":
                count = content.get("execution_count")
                await out.emit({"type": "number_of_executions", "execution_count": count})
            elif kind == "stream":
                stream = "stderr" if content.get("name") == "stderr" else "stdout"
                await out.emit({"type": stream, "text": content["text"], "timestamp": timestamp})
            elif kind in ("execute_result", "display_data"):
                await out.emit(result_item(content, kind == "execute_result"))
            elif kind == "error" and not error_sent:
                error_sent = True
                await out.emit(
                    _error(
                        content.get("ename", ""),
                        content.get("evalue", ""),
                        "\n".join(content.get("traceback") or []),
                    )
                )
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        await self.reply(msg_id)


@dataclass
class NodeContext(Context):
    """JavaScript or TypeScript: a Node.js process running e2b_js_kernel.mjs (see there),
    requests on its stdin, events on a pipe of their own."""

    process: asyncio.subprocess.Process | None = None
    events: asyncio.StreamReader | None = None
    pending: asyncio.Future[bytes] | None = None
    count: int = 0
    next_id: int = 0

    async def start(self) -> None:
        read_fd, write_fd = os.pipe()
        env = {**self.kernel_env(), "E2B_EVENTS_FD": str(write_fd)}
        try:
            self.process = await asyncio.create_subprocess_exec(
                NODE,
                JS_KERNEL,
                cwd=self.cwd,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        self.events = asyncio.StreamReader(limit=1 << 26, loop=loop)
        pipe = os.fdopen(read_fd, "rb", buffering=0)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self.events), pipe)
        self.count = 0
        await asyncio.wait_for(self.set_env({}), KERNEL_START_TIMEOUT_S)

    async def stop(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()

    async def restart_locked(self) -> None:
        await self.stop()
        await self.start()

    async def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def reap(self) -> None:
        """Its events pipe ended, so the process is gone or going: wait for it, so that
        :meth:`alive` says so. asyncio sets ``returncode`` only once it has reaped the
        child, a moment after the pipe closes; an execution in that moment would write to
        the dead kernel's stdin (a broken pipe) instead of starting a new one."""
        if self.process is None:
            return
        try:
            await asyncio.wait_for(self.process.wait(), KERNEL_START_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()

    async def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The kernel's next event; None after ``timeout`` s (the read stays pending);
        a "died" event once the process is gone."""
        assert self.events is not None
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.events.readline())
        done, _ = await asyncio.wait({self.pending}, timeout=timeout)
        if not done:
            return None
        fut, self.pending = self.pending, None
        line = fut.result()
        if not line:
            return {"type": "died"}
        return json.loads(line)  # type: ignore[no-any-return]

    async def request(self, body: dict[str, Any]) -> int:
        assert self.process is not None and self.process.stdin is not None
        self.next_id += 1
        self.process.stdin.write(json.dumps({"id": self.next_id, **body}).encode() + b"\n")
        await self.process.stdin.drain()
        return self.next_id

    async def set_env(self, values: dict[str, str | None]) -> None:
        wanted = await self.request({"env": values})
        while True:
            event = await self.next_event(KERNEL_START_TIMEOUT_S)
            if event is None or event["type"] == "died":
                raise RuntimeError("the JavaScript kernel did not answer")
            if event.get("id") == wanted and event["type"] == "done":
                return

    async def execute(self, code: str, out: Output) -> None:
        wanted = await self.request({"code": code, "language": self.language})
        self.count += 1
        await out.emit({"type": "number_of_executions", "execution_count": self.count})
        interrupted = False
        error_sent = False
        while True:
            if out.gone and not interrupted and self.process is not None:
                interrupted = True
                with contextlib.suppress(ProcessLookupError):
                    self.process.send_signal(signal.SIGINT)
            event = await self.next_event(KEEPALIVE_S)
            if event is None:
                await out.emit({"type": "keepalive"})
                continue
            kind = event["type"]
            if kind == "died":
                await self.reap()
                await out.emit(_error("KernelDied", "the kernel exited", ""))
                return
            if event.get("id") != wanted:
                continue
            if kind in ("stdout", "stderr"):
                stamp = datetime.datetime.now(datetime.UTC).isoformat()
                await out.emit({"type": kind, "text": event["text"], "timestamp": stamp})
            elif kind == "result":
                data = {"text/plain": event["text"]}
                await out.emit(result_item({"data": data}, True))
            elif kind == "error" and not error_sent:
                error_sent = True
                await out.emit(_error(event["name"], event["value"], event["traceback"]))
            elif kind == "done":
                return


class Contexts:
    def __init__(self) -> None:
        self.by_id: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}  # language -> id of its default context
        self.making: dict[str, asyncio.Lock] = {}  # one default context per language

    async def create(self, language: str, cwd: str, *, default: bool = False) -> Context:
        if not os.path.isdir(cwd):
            raise RequestError(400, f"cwd {cwd!r} is not a directory in the sandbox")
        if not os.access(cwd, os.X_OK):
            raise RequestError(400, f"cwd {cwd!r} is not open to the user the kernels run as")
        kind = NodeContext if language in ("javascript", "typescript") else JupyterContext
        ctx: Context = kind(id=str(uuid.uuid4()), language=language, cwd=cwd)
        try:
            await ctx.start()
        except Exception as exc:
            await ctx.stop()
            log.exception("a %s kernel did not start", language)
            raise RequestError(500, f"Failed to create context: {exc}") from exc
        self.by_id[ctx.id] = ctx
        if default:
            self.defaults[language] = ctx.id
        return ctx

    async def default_for(self, language: str) -> Context:
        async with self.making.setdefault(language, asyncio.Lock()):
            ctx_id = self.defaults.get(language)
            if ctx_id is not None and ctx_id in self.by_id:
                return self.by_id[ctx_id]
            return await self.create(language, DEFAULT_CWD, default=True)

    def get(self, ctx_id: str) -> Context:
        if ctx_id == "default":
            ctx_id = self.defaults.get("python", "")
        ctx = self.by_id.get(ctx_id)
        if ctx is None:
            raise RequestError(404, f"Context {ctx_id} not found")
        return ctx

    def listed(self) -> list[dict[str, str]]:
        return [ctx.describe() for ctx in self.by_id.values()]

    async def remove(self, ctx_id: str) -> None:
        ctx = self.get(ctx_id)
        del self.by_id[ctx.id]
        for language, default_id in list(self.defaults.items()):
            if default_id == ctx.id:
                del self.defaults[language]
        async with ctx.lock:
            await ctx.stop()


def _error(name: str, value: str, traceback: str) -> dict[str, Any]:
    return {"type": "error", "name": name, "value": value, "traceback": traceback}
