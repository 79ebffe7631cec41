"""``process.Process``: envd's process service over the runtime's processes.

Semantics as envd has them (docs/dataplane.md, "Data plane", lists them): the command runs as
the caller's user (Basic auth) or the sandbox's default one, in ``cwd`` (``~`` and relative
paths under the user's home; a missing one is invalid_argument), with the sandbox's env vars
then the call's; ``Connect-Timeout-Ms`` on Start is the process's lifetime; output goes to
every follower; a process that ended in the last 30 s still answers a Connect.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_pb as pb
from protobuf import Oneof

from e2bfacade.runtime.base import (
    ExitStatus,
    FileType,
    GuestFileError,
    GuestProcess,
    ProcessNotFound,
    ProcessSpec,
    PtySize,
    RuntimeConflict,
    SandboxNotFound,
    SandboxRuntimeError,
    SandboxState,
    Stream,
    UnknownUser,
)
from e2bfacade.runtime.guest import Guest
from nodes.selectors import local_runtime
from sandboxes.dataplane import streams
from sandboxes.dataplane.target import current, response

if TYPE_CHECKING:
    from connectrpc.request import RequestContext

# Go's names for signals, as envd's end event says "signal: killed".
SIGNAL_NAMES = {
    signal.SIGKILL: "killed",
    signal.SIGTERM: "terminated",
    signal.SIGINT: "interrupt",
    signal.SIGHUP: "hangup",
    signal.SIGQUIT: "quit",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGABRT: "aborted",
    signal.SIGPIPE: "broken pipe",
    signal.SIGUSR1: "user defined signal 1",
    signal.SIGUSR2: "user defined signal 2",
}
T = TypeVar("T")
DEFAULT_KEEPALIVE_S = 90.0
OUTPUT_FIELD = {Stream.STDOUT: "stdout", Stream.STDERR: "stderr", Stream.PTY: "pty"}


def rpc_error(exc: SandboxRuntimeError) -> ConnectError:
    """A runtime failure as the Connect error envd would answer."""
    if isinstance(exc, ProcessNotFound):
        return ConnectError(Code.NOT_FOUND, exc.message)
    if isinstance(exc, SandboxNotFound):
        return ConnectError(Code.UNAVAILABLE, "The sandbox was not found")
    if isinstance(exc, RuntimeConflict):
        return ConnectError(Code.UNAVAILABLE, exc.message)
    if isinstance(exc, UnknownUser):
        return ConnectError(Code.UNAUTHENTICATED, f"invalid username: {exc.message}")
    if isinstance(exc, GuestFileError):
        if exc.errno == errno.EPIPE:  # a process's stdin, closed or never opened
            return ConnectError(Code.INTERNAL, "stdin not enabled or closed")
        code = {
            errno.ENOENT: Code.NOT_FOUND,
            errno.EACCES: Code.PERMISSION_DENIED,
            errno.EPERM: Code.PERMISSION_DENIED,
            errno.EEXIST: Code.ALREADY_EXISTS,
            errno.ENOTDIR: Code.INVALID_ARGUMENT,
            errno.EISDIR: Code.INVALID_ARGUMENT,
            errno.EINVAL: Code.INVALID_ARGUMENT,
            errno.ENAMETOOLONG: Code.INVALID_ARGUMENT,
            errno.ELOOP: Code.FAILED_PRECONDITION,
            errno.EBUSY: Code.FAILED_PRECONDITION,
            errno.EXDEV: Code.FAILED_PRECONDITION,
            errno.ENOTEMPTY: Code.FAILED_PRECONDITION,
            errno.ETXTBSY: Code.FAILED_PRECONDITION,
            errno.EROFS: Code.PERMISSION_DENIED,
            errno.EFBIG: Code.RESOURCE_EXHAUSTED,
            errno.EMFILE: Code.RESOURCE_EXHAUSTED,
            errno.EOVERFLOW: Code.RESOURCE_EXHAUSTED,  # a watcher lost changes
            errno.ENOTTY: Code.FAILED_PRECONDITION,  # a terminal call on a pipe, or back
            errno.ENOSPC: Code.RESOURCE_EXHAUSTED,
            errno.EDQUOT: Code.RESOURCE_EXHAUSTED,
            errno.EAGAIN: Code.RESOURCE_EXHAUSTED,
        }.get(exc.errno, Code.INTERNAL)
        return ConnectError(code, exc.message)
    return ConnectError(Code.INTERNAL, exc.message)


def event(kind: str, value: object) -> pb.ProcessEvent:
    """A ProcessEvent with its ``kind`` oneof set (start, data, end, keepalive)."""
    return pb.ProcessEvent(event=Oneof(kind, value))  # type: ignore[arg-type]


def output_event(stream: Stream, data: bytes) -> pb.ProcessEvent:
    output = Oneof(OUTPUT_FIELD[stream], data)
    return event("data", pb.ProcessEvent.DataEvent(output=output))  # type: ignore[arg-type]


async def rpc(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """``fn(*args, **kwargs)`` on a thread, its runtime failures as envd's Connect errors."""
    try:
        return await streams.call(fn, *args, **kwargs)
    except SandboxRuntimeError as exc:
        raise rpc_error(exc) from None


def end_event(status: ExitStatus) -> pb.ProcessEvent:
    if status.signal is not None:
        name = SIGNAL_NAMES.get(signal.Signals(status.signal), f"signal {status.signal}")
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=f"signal: {name}")
    else:
        text = f"exit status {status.exit_code}"
        end = pb.ProcessEvent.EndEvent(
            exit_code=status.exit_code,
            exited=True,
            status=text,
            error=text if status.exit_code else None,
        )
    return event("end", end)


def keepalive_interval(ctx: RequestContext[object, object]) -> float:
    raw = ctx.request_headers.get("keepalive-ping-interval", "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_KEEPALIVE_S
    return value if value > 0 else DEFAULT_KEEPALIVE_S


async def follow(
    proc: GuestProcess, ctx: RequestContext[object, object], *, lifetime: bool
) -> AsyncIterator[pb.ProcessEvent]:
    """The process's events after its start: output, keepalives in silences, the end.
    The stream's own deadline ends it with deadline_exceeded (on Start that deadline is
    also the process's lifetime, which the runtime enforces)."""
    interval = keepalive_interval(ctx)
    remaining = ctx.timeout_ms
    deadline = None if remaining is None else time.monotonic() + remaining / 1000
    chunks = streams.pump(proc.output(65536), close=proc.close).__aiter__()
    try:
        while True:
            wait = interval
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise ConnectError(Code.DEADLINE_EXCEEDED, "the call's deadline elapsed")
            try:
                stream, data = await asyncio.wait_for(anext(chunks), wait)
            except StopAsyncIteration:
                break
            except TimeoutError:
                yield event("keepalive", pb.ProcessEvent.KeepAlive())
                continue
            yield output_event(stream, data)
        status = await streams.call(proc.wait)
        if lifetime and deadline is not None and time.monotonic() >= deadline - 0.05:
            raise ConnectError(Code.DEADLINE_EXCEEDED, "the process's lifetime elapsed")
        if status.signal == signal.SIGKILL and not await _still_running():
            # Killed with its sandbox: the connection is cut (target.Response), as when
            # envd's VM goes away; the SDK asks /health (502) and reports the sandbox gone.
            response.get().cut = True
            raise ConnectError(Code.UNAVAILABLE, "the sandbox ended while the process ran")
        yield end_event(status)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
        proc.close()


async def _still_running() -> bool:
    try:
        info = await streams.call(local_runtime().status, current.get().sandbox.sandbox_id)
    except SandboxRuntimeError:
        return False
    return info.state is SandboxState.RUNNING


def start_event(pid: int) -> pb.ProcessEvent:
    return event("start", pb.ProcessEvent.StartEvent(pid=pid))


def selected_pid(selector: pb.ProcessSelector | None) -> int:
    match selector.selector if selector is not None else None:
        case Oneof(field="pid", value=pid):
            return int(pid)
        case Oneof(field="tag", value=tag):
            for info in current.get().guest.list_processes():
                if info.tag == tag:
                    return info.pid
            raise ConnectError(Code.NOT_FOUND, f"process with tag {tag!r} not found")
    raise ConnectError(Code.INVALID_ARGUMENT, "a process selector (pid or tag) is required")


async def resolve_cwd(guest: Guest, user: str | None, cwd: str) -> str | None:
    """The working directory as the runtime takes it (None: the user's home); a missing
    or non-directory one is refused as envd refuses it."""
    if not cwd:
        return None
    try:
        entry = await streams.call(guest.stat, cwd, user=user)
    except GuestFileError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ConnectError(Code.INVALID_ARGUMENT, f"cwd '{cwd}' does not exist") from None
        raise rpc_error(exc) from None
    if entry.type is FileType.SYMLINK and entry.symlink_target:
        return entry.symlink_target
    if entry.type is not FileType.DIRECTORY:
        raise ConnectError(Code.INVALID_ARGUMENT, f"cwd '{cwd}' is not a directory")
    return entry.path


class ProcessService:
    """The ``process.Process`` service of the caller's sandbox (``target.current``)."""

    async def list(
        self, request: pb.ListRequest, ctx: RequestContext[object, object]
    ) -> pb.ListResponse:
        caller = current.get()
        infos = await rpc(caller.guest.list_processes)
        return pb.ListResponse(
            processes=[
                pb.ProcessInfo(
                    pid=info.pid,
                    tag=info.tag,
                    config=pb.ProcessConfig(
                        cmd=info.argv[0],
                        args=list(info.argv[1:]),
                        envs=dict(info.env),
                        cwd=info.cwd,
                    ),
                )
                for info in infos
            ]
        )

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[object, object]
    ) -> AsyncIterator[pb.StartResponse]:
        caller = current.get()
        config = request.process
        if config is None or not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is required")
        remaining = ctx.timeout_ms
        pty = None
        if request.pty is not None:
            size = request.pty.size
            pty = PtySize(cols=size.cols if size else 80, rows=size.rows if size else 24)
        # Absent means a pipe (envd's old default); the SDKs send false for /dev/null.
        stdin = True if request.stdin is None else bool(request.stdin)
        try:
            cwd = await resolve_cwd(caller.guest, caller.user, config.cwd or "")
            spec = ProcessSpec(
                argv=(config.cmd, *config.args),
                user=caller.user,
                cwd=cwd,
                env=dict(config.envs),
                stdin=stdin or pty is not None,
                pty=pty,
                timeout=None if remaining is None else max(remaining / 1000, 0.001),
                tag=request.tag or None,
            )
            proc = await streams.call(caller.guest.start_process, spec)
        except SandboxRuntimeError as exc:
            raise rpc_error(exc) from None
        yield pb.StartResponse(event=start_event(proc.pid))
        async for event in follow(proc, ctx, lifetime=True):
            yield pb.StartResponse(event=event)

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[object, object]
    ) -> AsyncIterator[pb.ConnectResponse]:
        caller = current.get()
        pid = await rpc(selected_pid, request.process)
        proc = await rpc(caller.guest.connect_process, pid)
        yield pb.ConnectResponse(event=start_event(proc.pid))
        async for event in follow(proc, ctx, lifetime=False):
            yield pb.ConnectResponse(event=event)

    async def update(
        self, request: pb.UpdateRequest, ctx: RequestContext[object, object]
    ) -> pb.UpdateResponse:
        caller = current.get()
        if request.pty is None or request.pty.size is None:
            return pb.UpdateResponse()
        size = PtySize(cols=request.pty.size.cols, rows=request.pty.size.rows)
        pid = await rpc(selected_pid, request.process)
        await rpc(caller.guest.process_resize, pid, size)
        return pb.UpdateResponse()

    async def _input(self, pid: int, data: pb.ProcessInput | None) -> None:
        match data.input if data is not None else None:
            case Oneof(field="stdin", value=payload) | Oneof(field="pty", value=payload):
                chunk = bytes(payload)
            case _:
                return
        await rpc(current.get().guest.process_stdin, pid, chunk)

    async def send_input(
        self, request: pb.SendInputRequest, ctx: RequestContext[object, object]
    ) -> pb.SendInputResponse:
        pid = await rpc(selected_pid, request.process)
        await self._input(pid, request.input)
        return pb.SendInputResponse()

    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[object, object]
    ) -> pb.StreamInputResponse:
        pid: int | None = None
        async for message in request:
            value = message.event.value if message.event is not None else None
            if isinstance(value, pb.StreamInputRequest.StartEvent):
                pid = await rpc(selected_pid, value.process)
            elif isinstance(value, pb.StreamInputRequest.DataEvent):
                if pid is None:
                    raise ConnectError(Code.FAILED_PRECONDITION, "the start event comes first")
                await self._input(pid, value.input)
        return pb.StreamInputResponse()

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[object, object]
    ) -> pb.CloseStdinResponse:
        caller = current.get()
        pid = await rpc(selected_pid, request.process)
        await rpc(caller.guest.process_close_stdin, pid)
        return pb.CloseStdinResponse()

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[object, object]
    ) -> pb.SendSignalResponse:
        caller = current.get()
        signum = {pb.Signal.SIGKILL: signal.SIGKILL, pb.Signal.SIGTERM: signal.SIGTERM}.get(
            request.signal
        )
        if signum is None:
            raise ConnectError(Code.UNIMPLEMENTED, f"signal {request.signal} is not supported")
        pid = await rpc(selected_pid, request.process)
        await rpc(caller.guest.process_signal, pid, signum)
        return pb.SendSignalResponse()
