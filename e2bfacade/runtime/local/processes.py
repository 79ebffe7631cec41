"""Processes inside a local sandbox, run by its guest agent (launcher/c/agent_*.c): a
process of the sandbox's own that starts commands under a shepherd (the subreaper of
everything the command starts, killed as a tree when its lifetime ends), fans their output
out to every follower and holds them across restarts of the service. The host speaks to it
on the unix socket ``sandboxes/<id>/agent.sock``, one request per connection.

The agent runs as the guest's root and the guest may kill or confuse it: everything read
from it is bounded (a frame is at most :data:`MAX_FRAME` bytes) and checked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from e2bfacade.runtime.base import (
    ExitStatus,
    FsChange,
    FsEvent,
    GuestFileError,
    ProcessSpec,
    PtySize,
    RuntimeConflict,
    Stream,
    WatcherChanges,
)
from e2bfacade.runtime.local.guest.accounts import Account

GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_FRAME = (1 << 20) + 64
STDIN_PIECE = 1 << 20  # the agent takes stdin in pieces of at most this
TCP_LIVENESS = (
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 2),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
    (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 10000),
)
STREAMS = {b"O": Stream.STDOUT, b"R": Stream.STDERR, b"T": Stream.PTY}


class AgentGone(RuntimeConflict):
    """The sandbox's agent does not answer: the sandbox ended (or its guest killed it)."""


def _exit_status(raw: int) -> ExitStatus:
    if os.WIFSIGNALED(raw):
        sig = os.WTERMSIG(raw)
        return ExitStatus(128 + sig, sig)
    return ExitStatus(os.WEXITSTATUS(raw))


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """One frame from the agent: (type, payload), or None when it hung up."""
    head = _recv_exact(sock, 5)
    if head is None:
        return None
    length = struct.unpack(">I", head[:4])[0]
    if not 1 <= length <= MAX_FRAME:
        raise AgentGone(f"the sandbox's agent sent a malformed frame (length {length})")
    payload = _recv_exact(sock, length - 1) if length > 1 else b""
    if payload is None:
        return None
    return head[4:5], payload


def _first_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """The answer that opens a followed connection (start, connect, watch), read under the
    connection's open timeout: a guest can stop its agent, and no host thread may wait on it
    for ever. What follows the answer is the guest's pace (a command may be silent for
    hours), so the connection blocks from then on."""
    try:
        first = read_frame(sock)
    except TimeoutError:
        sock.close()
        raise AgentGone("the sandbox's agent did not answer") from None
    except OSError:
        first = None
    sock.settimeout(None)
    return first


def _frame(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 1 + len(payload)) + kind + payload


def _error(payload: bytes) -> GuestFileError:
    code = struct.unpack(">I", payload[:4])[0] if len(payload) >= 4 else errno.EIO
    return GuestFileError(code, payload[4:512].decode(errors="replace") or os.strerror(code))


@dataclass(frozen=True)
class ProcessEntry:
    """A running process as the agent lists it, with the items it was started with."""

    pid: int
    args: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    tag: str | None
    user_env: dict[str, str]
    pty: bool


class Agent:
    """The guest agent of one sandbox."""

    def __init__(self, address: Path | tuple[str, int]) -> None:
        """``address``: the agent's unix socket on the host, or (for a sandbox whose agent
        serves on its link: the gVisor driver's) its guest address and port."""
        self.address = address

    def _open(self, kind: bytes, payload: bytes, timeout: float | None = 30) -> socket.socket:
        family = socket.AF_UNIX if isinstance(self.address, Path) else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        if family == socket.AF_INET:
            # A guest whose kernel died (gVisor's, killed as a whole) never closes its end:
            # probes find that within ~5 s, and unanswered data within 10 s, so no reader
            # of a dead sandbox's stream waits for ever.
            for level, option, value in TCP_LIVENESS:
                sock.setsockopt(level, option, value)
        sock.settimeout(timeout)
        try:
            sock.connect(str(self.address) if isinstance(self.address, Path) else self.address)
            sock.sendall(_frame(kind, payload))
        except OSError as exc:
            sock.close()
            raise AgentGone(f"the sandbox's agent does not answer: {exc.strerror}") from None
        return sock

    def _call(self, kind: bytes, payload: bytes) -> list[tuple[bytes, bytes]]:
        """A request answered by frames ending in 'A' (returned before it) or 'E' (raised)."""
        frames: list[tuple[bytes, bytes]] = []  # at most 8192 (a watcher keeps fewer)
        with self._open(kind, payload) as sock:
            while True:
                frame = read_frame(sock)
                if frame is None:
                    raise AgentGone("the sandbox's agent hung up")
                if frame[0] == b"A":
                    return frames
                if frame[0] == b"E":
                    raise _error(frame[1])
                frames.append(frame)
                if len(frames) > 16384:
                    raise AgentGone("the sandbox's agent sent too much")

    def start(self, items: list[str], *, pty: bool) -> AgentProcess:
        payload = b"".join(item.encode() + b"\0" for item in items)
        return AgentProcess(self, self._open(b"S", payload), pty=pty)

    def connect(self, pid: int, *, pty: bool = False) -> AgentProcess:
        return AgentProcess(self, self._open(b"C", struct.pack(">I", pid)), pty=pty)

    def list(self) -> list[ProcessEntry]:
        out = []
        for _, payload in self._call(b"L", b""):
            if len(payload) < 4:
                continue
            pid = struct.unpack(">I", payload[:4])[0]
            args: list[str] = []
            env: dict[str, str] = {}
            user_env: dict[str, str] = {}
            cwd, tag, pty = "/", None, False
            for raw in payload[4:].split(b"\0"):
                key, _, value = raw.decode(errors="replace").partition("=")
                if key == "arg":
                    args.append(value)
                elif key in ("env", "user_env"):
                    name, _, val = value.partition("=")
                    (env if key == "env" else user_env)[name] = val
                elif key == "cwd":
                    cwd = value
                elif key == "tag":
                    tag = value
                elif key == "pty":
                    pty = True
            if b"builtin=read" not in payload[4:].split(b"\0"):  # the host's own read
                out.append(ProcessEntry(pid, tuple(args), env, cwd, tag, user_env, pty))
        return out

    def write_stdin(self, pid: int, data: bytes) -> None:
        for at in range(0, len(data), STDIN_PIECE):
            self._call(b"I", struct.pack(">I", pid) + data[at : at + STDIN_PIECE])

    def close_stdin(self, pid: int) -> None:
        self._call(b"D", struct.pack(">I", pid))

    def signal(self, pid: int, signum: int) -> None:
        self._call(b"K", struct.pack(">II", pid, signum))

    def resize(self, pid: int, size: PtySize) -> None:
        self._call(b"Z", struct.pack(">IHH", pid, size.cols, size.rows))

    # Watchers: the path is a guest path the caller has checked (an existing directory).
    def watch(self, path: str, *, recursive: bool) -> AgentWatch:
        sock = self._open(b"W", bytes([int(recursive)]) + path.encode())
        first = _first_frame(sock)
        if first is None or first[0] != b"w":
            sock.close()
            if first is not None and first[0] == b"E":
                raise _error(first[1])
            raise AgentGone("the sandbox's agent did not start the watch")
        return AgentWatch(sock)

    def new_watcher(self, path: str, *, recursive: bool, include_entry: bool = False) -> int:
        flags = int(recursive) | (2 if include_entry else 0)
        # The answer is one frame: the agent's hang-up is not waited for (over TCP the
        # host hangs up first, see agent_conn.c).
        with self._open(b"N", bytes([flags]) + path.encode()) as sock:
            frame = read_frame(sock)
        if frame is not None and frame[0] == b"E":
            raise _error(frame[1])
        if frame is not None and frame[0] == b"w" and len(frame[1]) == 4:
            return int(struct.unpack(">I", frame[1])[0])
        raise AgentGone("the sandbox's agent did not make the watcher")

    def watcher_changes(self, watcher_id: int) -> WatcherChanges:
        frames = self._call(b"G", struct.pack(">I", watcher_id))
        head = next((payload for kind, payload in frames if kind == b"r" and payload), b"\0")
        events = tuple(
            _change(payload)
            for kind, payload in frames
            if kind == b"F" and payload and 1 <= payload[0] <= 5
        )
        return WatcherChanges(head[1:].decode(errors="replace"), bool(head[0] & 2), events)

    def remove_watcher(self, watcher_id: int) -> None:
        self._call(b"Q", struct.pack(">I", watcher_id))

    def notify(self, change: FsChange, path: str, *, is_dir: bool = False) -> None:
        """Tell the guest's watchers of a change made outside its kernel (``path``: the
        absolute guest path), as inotify would have."""
        self._call(b"Y", bytes([int(change) | (0x80 if is_dir else 0)]) + path.encode())


def _change(payload: bytes) -> FsEvent:
    return FsEvent(FsChange(payload[0]), payload[1:].decode(errors="replace"))


class AgentWatch:
    """A directory followed by the agent on one connection; closing it ends the watch."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def __iter__(self) -> Iterator[FsEvent]:
        while True:
            try:
                frame = read_frame(self._sock)
            except OSError:
                return
            if frame is None:
                return
            if frame[0] == b"F" and frame[1] and 1 <= frame[1][0] <= 5:
                yield _change(frame[1])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()


class AgentProcess:
    """A process of the guest agent, followed on one connection; see
    :class:`e2bfacade.runtime.base.GuestProcess`. Closing the connection stops following;
    the process goes on (its lifetime is the agent's to enforce)."""

    def __init__(self, agent: Agent, sock: socket.socket, *, pty: bool) -> None:
        self._agent = agent
        self._sock = sock
        self._pty = pty
        self._status: ExitStatus | None = None
        self._pending: list[tuple[Stream, bytes]] = []
        self._reading = False
        self._done = threading.Event()
        first = _first_frame(sock)
        if first is None or first[0] == b"E":
            sock.close()
            if first is None:
                raise AgentGone("the sandbox's agent hung up")
            raise _error(first[1])
        if first[0] != b"P" or len(first[1]) != 4:
            sock.close()
            raise AgentGone("the sandbox's agent answered out of turn")
        self._pid = int(struct.unpack(">I", first[1])[0])

    def _next(self) -> tuple[bytes, bytes] | None:
        try:
            return read_frame(self._sock)
        except OSError:
            return None

    def _event(self) -> tuple[Stream, bytes] | None:
        """The next output chunk, or None once the process has ended (status set)."""
        while self._status is None:
            frame = self._next()
            if frame is None:  # the agent is gone: so is the sandbox, and the process
                self._status = ExitStatus(128 + 9, 9)
                self._done.set()
                break
            kind, payload = frame
            if kind in STREAMS:
                return STREAMS[kind], payload
            if kind == b"X" and len(payload) == 4:
                self._status = _exit_status(struct.unpack(">I", payload)[0])
                self._done.set()
            elif kind == b"E":
                raise _error(payload)
        return None

    @property
    def pid(self) -> int:
        return self._pid

    def output(self, chunk_size: int = 65536) -> Iterator[tuple[Stream, bytes]]:
        self._reading = True  # from now on only this iterator reads the connection
        try:
            while True:
                event = self._pending.pop(0) if self._pending else self._event()
                if event is None:
                    return
                stream, data = event
                for at in range(0, len(data), chunk_size):
                    yield stream, data[at : at + chunk_size]
        finally:
            self._reading = False

    def write_stdin(self, data: bytes) -> None:
        self._agent.write_stdin(self._pid, data)

    def close_stdin(self) -> None:
        if self._pty:
            self._agent.write_stdin(self._pid, b"\x04")  # EOF at a line's start, as a tty does
        else:
            self._agent.close_stdin(self._pid)

    def send_signal(self, signum: int) -> None:
        if self._status is not None:
            return
        with contextlib.suppress(GuestFileError, AgentGone):
            self._agent.signal(self._pid, signum)

    def resize(self, size: PtySize) -> None:
        if not self._pty:
            raise GuestFileError(errno.ENOTTY, "the process has no terminal")
        self._agent.resize(self._pid, size)

    def wait(self, timeout: float | None = None) -> ExitStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._status is None:
            left = None if deadline is None else deadline - time.monotonic()
            if self._reading:  # output() is being read (on another thread): it sets the end
                if not self._done.wait(left if left is None else max(left, 0)):
                    raise TimeoutError(f"process {self._pid} still runs after {timeout}s")
                continue
            if left is not None and (left <= 0 or not select.select([self._sock], [], [], left)[0]):
                # Only a frame's start is waited for: once begun, a frame is read whole.
                raise TimeoutError(f"process {self._pid} still runs after {timeout}s")
            event = self._event()
            if event is not None and len(self._pending) < 64:
                self._pending.append(event)  # kept for output(), up to 64 chunks
        return self._status

    def close(self) -> None:
        # shutdown first: it wakes a thread blocked reading this connection (close alone
        # would not).
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()


def start_items(account: Account, spec: ProcessSpec, env: dict[str, str], cwd: str) -> list[str]:
    """The agent's start request for ``spec`` run as ``account`` (see launcher/c/agent_proc.c)."""
    items = [f"uid={account.uid}", f"gid={account.gid}", f"cwd={cwd}"]
    if spec.stdin:
        items.append("stdin=1")
    if spec.pty is not None:
        items.append(f"pty={spec.pty.cols},{spec.pty.rows}")
    if spec.timeout is not None:
        items.append(f"lifetime={max(1, int(spec.timeout * 1000))}")
    if spec.tag is not None:
        items.append(f"tag={spec.tag}")
    items += [f"arg={a}" for a in spec.argv]
    items += [f"env={k}={v}" for k, v in env.items()]
    # Not used by the agent; kept with the process so that List can show what was asked.
    items += [f"user_env={k}={v}" for k, v in spec.env.items()]
    return items


def process_env(account: Account, sandbox_env: dict[str, str], spec: ProcessSpec) -> dict[str, str]:
    """The environment of a guest process: a sane base, the sandbox's env vars, then the
    process's own (later wins). Nothing of the host's."""
    env = {
        "PATH": GUEST_PATH,
        "HOME": account.home,
        "USER": account.name,
        "LOGNAME": account.name,
        "LANG": "C.UTF-8",
    }
    if spec.pty is not None:
        env["TERM"] = "xterm-256color"
    env.update(sandbox_env)
    env.update(spec.env)
    return env


# The agent's bound on a builtin read (agent.h READ_MAX), and the read's lifetime: a file
# of /proc or /sys that gives more, or takes longer, is no file a user reads whole.
READ_MAX = 1 << 20
READ_LIFETIME_MS = 10_000


def read_in_guest(agent: Agent, account: Account, path: str) -> bytes:
    """The file ``path`` as ``account`` reads it in the guest (the agent's builtin read):
    the host's way to the guest's /proc and /sys, which no host thread opens. At most
    READ_MAX bytes (EFBIG past them); a failure is GuestFileError with the guest's errno."""
    items = [f"uid={account.uid}", f"gid={account.gid}", "cwd=/", "builtin=read"]
    items += [f"lifetime={READ_LIFETIME_MS}", f"arg={path}"]
    proc = agent.start(items, pty=False)
    data = bytearray()
    try:
        for stream, chunk in proc.output():
            if stream is Stream.STDOUT and len(data) <= READ_MAX:
                data += chunk  # past the bound: read and dropped, the agent stops anyway
        status = proc.wait()
    finally:
        proc.close()
    code = status.exit_code
    if code == 0 and len(data) > READ_MAX:
        code = errno.EFBIG
    if code == 0:
        return bytes(data)
    if status.signal is not None or code not in errno.errorcode or code >= 125:
        code = errno.EIO  # killed at its lifetime, or the shepherd's own failure
    raise GuestFileError(code, f"{path}: {os.strerror(code)}")
