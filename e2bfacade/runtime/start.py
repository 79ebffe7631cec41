"""A template's start command, run in each new (or cold-booted) sandbox of it, through the
Guest interface only (so every driver runs it alike), and what it and the ready command
write until the sandbox is ready, kept bounded (:class:`StartOutput`) for the sandbox's
logs."""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from pathlib import Path

from e2bfacade.runtime.base import (
    ConsoleLine,
    CreateRefused,
    ExitStatus,
    GuestFileError,
    GuestProcess,
    ProcessSpec,
    StartCommand,
    Stream,
)
from e2bfacade.runtime.guest import Guest, run_process

# Where a start command finds the sandbox's env vars when they change after it started (a
# pool sandbox's claim, local/pools/warm.py): a JSON object; ``E2B_ENV_FILE`` names it.
GUEST_ENV_FILE = "/run/e2b/env.json"
# How often a ready command is run until it succeeds (E2B: every 2 s; a create waits for
# it, so more often here: one run of `[ -f x ]` costs a few milliseconds).
READY_INTERVAL = 0.25
# What is kept of the start and ready commands' output, per boot: the newest lines, at most
# LINES_MAX of them and BYTES_MAX bytes of text, a line cut at LINE_MAX bytes. A guest that
# writes without end costs the host one chunk in flight and these bounds, never more: older
# lines are dropped as newer ones come, and a line with no newline is cut where it passes
# LINE_MAX.
LINES_MAX = 1000
BYTES_MAX = 64 * 1024
LINE_MAX = 4096
# Where a driver keeps a sandbox's latest StartOutput on the host (StartOutput.save/load).
OUTPUT_FILE = "start-output.jsonl"


class StartOutput:
    """The start and ready commands' output during one boot, as lines, bounded (see
    LINES_MAX). Thread-safe: the start command's output is read on a thread of its own."""

    def __init__(self) -> None:
        self._lines: collections.deque[ConsoleLine] = collections.deque()
        self._bytes = 0
        self._partial: dict[tuple[str, Stream], bytearray] = {}
        self._lock = threading.Lock()

    def feed(self, source: str, stream: Stream, data: bytes) -> None:
        """Add a chunk of ``source``'s ``stream``; complete lines are kept, the rest waits
        for its newline (or for LINE_MAX bytes, or :meth:`flush`)."""
        with self._lock:
            pending = self._partial.setdefault((source, stream), bytearray())
            pending += data
            while True:
                cut = pending.find(b"\n")
                if cut < 0 and len(pending) < LINE_MAX:
                    break
                end = cut if 0 <= cut < LINE_MAX else LINE_MAX
                self._keep(source, stream, bytes(pending[:end]))
                del pending[: end + 1 if end == cut else end]

    def note(self, source: str, stream: Stream, text: str) -> None:
        """Add ``text`` as whole lines of ``source`` (a ready command's result)."""
        self.feed(source, stream, text.encode(errors="replace").rstrip(b"\n") + b"\n")

    def flush(self) -> None:
        """Keep what waits for a newline as lines of its own (the command has ended)."""
        with self._lock:
            for (source, stream), pending in self._partial.items():
                if pending:
                    self._keep(source, stream, bytes(pending))
            self._partial.clear()

    def _keep(self, source: str, stream: Stream, raw: bytes) -> None:
        text = raw.rstrip(b"\r").decode(errors="replace")
        self._lines.append(ConsoleLine(time.time(), source, stream, text))
        self._bytes += len(text)
        while len(self._lines) > LINES_MAX or self._bytes > BYTES_MAX:
            self._bytes -= len(self._lines.popleft().text)

    def lines(self) -> list[ConsoleLine]:
        with self._lock:
            return list(self._lines)

    def tail(self, size: int = 800) -> str:
        """The last ``size`` characters of the start command's output (an error's why)."""
        said = "\n".join(line.text for line in self.lines() if line.source == "start")
        return said[-size:].strip()

    def save(self, directory: Path) -> None:
        """Replace the output kept in ``directory`` with this one (written aside, renamed:
        a reader never sees half of it). Its size is the bounds', whatever was written."""
        self.flush()
        rows = [
            json.dumps({"at": ln.at, "source": ln.source, "stream": ln.stream, "text": ln.text})
            for ln in self.lines()
        ]
        tmp = directory / f".{OUTPUT_FILE}.{os.getpid()}.{threading.get_ident()}"
        tmp.write_text("".join(row + "\n" for row in rows))
        os.replace(tmp, directory / OUTPUT_FILE)


def load_output(directory: Path) -> list[ConsoleLine]:
    """The output :meth:`StartOutput.save` kept in ``directory`` (none: empty). Read bounded:
    a file grown past what save writes is not the runtime's, and is read no further."""
    try:
        with open(directory / OUTPUT_FILE, "rb") as f:
            raw = f.read(8 * (BYTES_MAX + LINES_MAX * 128))
    except FileNotFoundError:
        return []
    out = []
    for row in raw.splitlines()[-LINES_MAX:]:
        try:
            item = json.loads(row)
            out.append(
                ConsoleLine(
                    float(item["at"]),
                    str(item["source"]),
                    Stream(item["stream"]),
                    str(item["text"]),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out


class _Follower:
    """Reads the start command's output on a thread of its own into ``output`` (so a command
    that writes much never blocks on a full pipe while its readiness is awaited), and keeps
    how it ended. The thread is the connection's only reader."""

    def __init__(self, proc: GuestProcess, output: StartOutput) -> None:
        self._proc = proc
        self._output = output
        self._ended = threading.Event()
        self.status: ExitStatus | None = None
        self._thread = threading.Thread(target=self._run, name="start-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for stream, data in self._proc.output():
                self._output.feed("start", stream, data)
            self.status = self._proc.wait()
        except Exception:  # noqa: BLE001 - a closed connection ends the following, nothing else
            pass
        finally:
            self._ended.set()

    def ended(self, timeout: float) -> ExitStatus | None:
        """How the command ended, once it has and its output is read; None until then."""
        self._ended.wait(timeout)
        return self.status

    def said(self) -> str:
        """The end of what it wrote (why it failed), once that is read."""
        self._ended.wait(5.0)
        return self._output.tail()

    def stop(self) -> None:
        """Stop following (the command runs on) and wait for the thread."""
        self._proc.close()
        self._thread.join(timeout=5)
        self._output.flush()


def run_kept(guest: Guest, start: StartCommand, directory: Path) -> None:
    """:func:`run_start_command`, its output saved in ``directory`` whether it comes up or
    not (:func:`load_output` reads it back)."""
    output = StartOutput()
    try:
        run_start_command(guest, start, output)
    finally:
        output.save(directory)


def run_start_command(guest: Guest, start: StartCommand, output: StartOutput | None = None) -> None:
    """Start the template's start command; return once it is ready (StartCommand). What it
    and the ready command write until then goes to ``output`` (bounded), which the caller
    keeps whether this returns or raises."""
    output = output if output is not None else StartOutput()
    proc = guest.start_process(
        ProcessSpec(
            argv=start.argv,
            user=start.user,
            cwd=start.cwd,
            env={**start.env, "E2B_ENV_FILE": GUEST_ENV_FILE},
            tag="start",
        )
    )
    follower = _Follower(proc, output)
    try:
        if start.ready_argv is not None:
            _wait_ready_command(guest, start, follower, output)
        elif start.ready_port is not None:
            _wait_port(guest, start, follower, output)
    finally:
        follower.stop()


def _wait_port(guest: Guest, start: StartCommand, proc: _Follower, output: StartOutput) -> None:
    assert start.ready_port is not None
    deadline = time.monotonic() + start.ready_timeout
    while True:
        try:
            guest.connect_port(start.ready_port, timeout=1.0).close()
            return
        except GuestFileError:
            pass
        status = proc.ended(0.01)
        if status is None:
            if time.monotonic() > deadline:
                raise CreateRefused(
                    f"the template's start command did not open port "
                    f"{start.ready_port} within {start.ready_timeout:g} s"
                )
            continue
        raise CreateRefused(
            f"the template's start command exited (status {status.exit_code}) before "
            f"port {start.ready_port} opened: {proc.said()}"
        )


def _wait_ready_command(
    guest: Guest, start: StartCommand, proc: _Follower, output: StartOutput
) -> None:
    assert start.ready_argv is not None
    deadline = time.monotonic() + start.ready_timeout
    spec = ProcessSpec(
        argv=start.ready_argv,
        user=start.user,
        cwd=start.cwd,
        env={**start.env, "E2B_ENV_FILE": GUEST_ENV_FILE},
        tag="ready",
        timeout=max(1.0, start.ready_timeout),
    )
    while True:
        result = run_process(guest, spec, max_output=LINE_MAX)
        if result.exit_code == 0:
            _note_ready(output, result.stdout, result.stderr)
            return
        status = proc.ended(0.0)
        if status is not None and status.exit_code != 0:
            raise CreateRefused(
                f"the template's start command failed (status {status.exit_code}) before "
                f"its ready command succeeded: {proc.said()}"
            )
        if time.monotonic() > deadline:
            # The last attempt's output says why it never succeeded (each attempt's would
            # repeat it every READY_INTERVAL).
            _note_ready(output, result.stdout, result.stderr, result.exit_code)
            raise CreateRefused(
                f"the template's ready command did not succeed within {start.ready_timeout:g} s"
            )
        time.sleep(READY_INTERVAL)


def _note_ready(output: StartOutput, stdout: bytes, stderr: bytes, code: int = 0) -> None:
    for stream, data in ((Stream.STDOUT, stdout), (Stream.STDERR, stderr)):
        if data.strip():
            output.feed("ready", stream, data.rstrip(b"\n") + b"\n")
    if code:
        output.note("ready", Stream.STDERR, f"the ready command exited with status {code}")
