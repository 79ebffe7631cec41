"""Processes inside a local sandbox, run through ``sandboxd exec`` (see sandboxd.c): it
joins the sandbox's cgroups and namespaces, applies the guests' seccomp filter, drops the
init's capabilities and starts the command under a shepherd inside the guest that is the
subreaper of everything the command starts, forwards signals to its process group, and
kills the whole tree when the process's lifetime ends. It reports the command's pids and
its wait status on a pipe of its own, so the host knows when the command itself ended even
while a background child still holds its output open.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import selectors
import signal
import struct
import subprocess
import termios
from collections.abc import Iterator

from e2bfacade.runtime.base import ExitStatus, GuestFileError, ProcessSpec, PtySize, Stream
from e2bfacade.runtime.local.files import Account

GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# -------------------------------------------------------------------------- processes
class LocalProcess:
    """A process started by ``sandboxd exec``; see :class:`e2bfacade.runtime.base.GuestProcess`."""

    def __init__(
        self, argv: list[str], spec: ProcessSpec, env: dict[str, str], seccomp_filter: str
    ) -> None:
        self._spec = spec
        report_r, report_w = os.pipe()
        self._master: int | None = None
        slave: int | None = None
        if spec.pty is not None:
            self._master, slave = os.openpty()
            _set_size(self._master, spec.pty)
        argv = [*argv[:7], _options(spec, report_w, seccomp_filter), *argv[7:]]
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=slave
                if slave is not None
                else (subprocess.PIPE if spec.stdin else subprocess.DEVNULL),
                stdout=slave if slave is not None else subprocess.PIPE,
                stderr=slave if slave is not None else subprocess.PIPE,
                env=env,
                pass_fds=(report_w,),
            )
        except BaseException:
            os.close(report_r)
            if self._master is not None:
                os.close(self._master)
            raise
        finally:
            os.close(report_w)
            if slave is not None:
                os.close(slave)
        self._report = os.fdopen(report_r, "r")
        self._host_pid = 0
        self._pid = 0
        self._status: ExitStatus | None = None
        first = self._report.readline().split()
        if len(first) == 3 and first[0] == "pid":
            self._host_pid, self._pid = int(first[1]), int(first[2])
        else:  # the helper failed before the command ran: it says why on stderr
            self._proc.wait()
            self._status = ExitStatus(self._proc.returncode or 125)

    @property
    def pid(self) -> int:
        return self._pid

    def output(self, chunk_size: int = 65536) -> Iterator[tuple[Stream, bytes]]:
        sel = selectors.DefaultSelector()
        streams: dict[int, Stream] = {}
        if self._master is not None:
            streams[self._master] = Stream.PTY
        else:
            assert self._proc.stdout is not None and self._proc.stderr is not None
            streams[self._proc.stdout.fileno()] = Stream.STDOUT
            streams[self._proc.stderr.fileno()] = Stream.STDERR
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        # The helper exits when the command does: its pidfd turns readable then.
        try:
            exited_fd: int | None = os.pidfd_open(self._proc.pid)
        except ProcessLookupError:
            exited_fd = None
        if exited_fd is not None:
            sel.register(exited_fd, selectors.EVENT_READ)
        exited = exited_fd is None or self._status is not None
        try:
            while streams and not exited:
                for key, _ in sel.select():
                    fd = int(key.fd)
                    if fd == exited_fd:
                        exited = True
                        continue
                    data = _read(fd, chunk_size)
                    if data:
                        yield streams[fd], data
                    else:
                        sel.unregister(fd)
                        del streams[fd]
            # Ended: what it wrote is in the pipes; take that, not what a background child
            # that still holds them may write later (it could hold them forever).
            for fd, stream in streams.items():
                os.set_blocking(fd, False)
                while True:
                    try:
                        data = _read(fd, chunk_size)
                    except BlockingIOError:
                        break
                    if not data:
                        break
                    yield stream, data
        finally:
            sel.close()
            if exited_fd is not None:
                os.close(exited_fd)

    def write_stdin(self, data: bytes) -> None:
        if self._master is not None:
            os.write(self._master, data)
            return
        if self._proc.stdin is None or self._proc.stdin.closed:
            raise GuestFileError(errno.EPIPE, "the process's stdin is closed")
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def close_stdin(self) -> None:
        if self._master is not None:
            os.write(self._master, b"\x04")  # EOF at the start of a line, as a terminal does
        elif self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()

    def send_signal(self, signum: int) -> None:
        if self._status is not None or not self._host_pid:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._host_pid, signum)

    def resize(self, size: PtySize) -> None:
        if self._master is None:
            raise GuestFileError(errno.ENOTTY, "the process has no terminal")
        _set_size(self._master, size)

    def wait(self, timeout: float | None = None) -> ExitStatus:
        if self._status is not None:
            return self._status
        if timeout is not None:
            sel = selectors.DefaultSelector()
            sel.register(self._report, selectors.EVENT_READ)
            ready = sel.select(timeout)
            sel.close()
            if not ready:
                raise TimeoutError(f"process {self._pid} still runs after {timeout}s")
        line = self._report.readline().split()
        self._proc.wait()
        if len(line) == 2 and line[0] == "status":
            raw = int(line[1])
            if os.WIFSIGNALED(raw):
                sig = os.WTERMSIG(raw)
                self._status = ExitStatus(128 + sig, sig)
            else:
                self._status = ExitStatus(os.WEXITSTATUS(raw))
        else:  # the helper itself was killed: so was the command (PDEATHSIG)
            self._status = ExitStatus(128 + signal.SIGKILL, signal.SIGKILL)
        return self._status

    def close(self) -> None:
        for f in (self._proc.stdin, self._proc.stdout, self._proc.stderr, self._report):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        if self._master is not None:
            with contextlib.suppress(OSError):
                os.close(self._master)
            self._master = None
        if self._proc.poll() is None and self._status is not None:
            self._proc.wait()


def _read(fd: int, size: int) -> bytes:
    try:
        return os.read(fd, size)
    except OSError as exc:  # EIO: a pty whose last writer closed
        if exc.errno != errno.EIO:
            raise
        return b""


def _options(spec: ProcessSpec, report_fd: int, seccomp_filter: str) -> str:
    opts = [f"report={report_fd}", f"seccomp={seccomp_filter}"]
    if spec.pty is not None:
        opts.append("pty")
    if spec.timeout is not None:
        opts.append(f"lifetime={max(1, int(spec.timeout * 1000))}")
    return ",".join(opts)


def _set_size(fd: int, size: PtySize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


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
