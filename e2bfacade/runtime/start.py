"""A template's start command, run in each new (or cold-booted) sandbox of it, through the
Guest interface only (so every driver runs it alike)."""

from __future__ import annotations

import time

from e2bfacade.runtime.base import (
    CreateRefused,
    ExitStatus,
    GuestFileError,
    GuestProcess,
    ProcessSpec,
    StartCommand,
)
from e2bfacade.runtime.guest import Guest, run_process

# Where a start command finds the sandbox's env vars when they change after it started (a
# pool sandbox's claim, local/pools/warm.py): a JSON object; ``E2B_ENV_FILE`` names it.
GUEST_ENV_FILE = "/run/e2b/env.json"
# How often a ready command is run until it succeeds (E2B: every 2 s; a create waits for
# it, so more often here: one run of `[ -f x ]` costs a few milliseconds).
READY_INTERVAL = 0.25


def run_start_command(guest: Guest, start: StartCommand) -> None:
    """Start the template's start command; return once it is ready (StartCommand)."""
    proc = guest.start_process(
        ProcessSpec(
            argv=start.argv,
            user=start.user,
            cwd=start.cwd,
            env={**start.env, "E2B_ENV_FILE": GUEST_ENV_FILE},
            tag="start",
        )
    )
    try:
        if start.ready_argv is not None:
            _wait_ready_command(guest, start, proc)
        elif start.ready_port is not None:
            _wait_port(guest, start, proc)
    finally:
        proc.close()


def _wait_port(guest: Guest, start: StartCommand, proc: GuestProcess) -> None:
    assert start.ready_port is not None
    deadline = time.monotonic() + start.ready_timeout
    while True:
        try:
            guest.connect_port(start.ready_port, timeout=1.0).close()
            return
        except GuestFileError:
            pass
        status = _ended(proc, 0.01)
        if status is None:
            if time.monotonic() > deadline:
                raise CreateRefused(
                    f"the template's start command did not open port "
                    f"{start.ready_port} within {start.ready_timeout:g} s"
                )
            continue
        raise CreateRefused(
            f"the template's start command exited (status {status.exit_code}) before "
            f"port {start.ready_port} opened: {_said(proc)}"
        )


def _wait_ready_command(guest: Guest, start: StartCommand, proc: GuestProcess) -> None:
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
        if run_process(guest, spec, max_output=4096).exit_code == 0:
            return
        status = _ended(proc, 0.0)
        if status is not None and status.exit_code != 0:
            raise CreateRefused(
                f"the template's start command failed (status {status.exit_code}) before "
                f"its ready command succeeded: {_said(proc)}"
            )
        if time.monotonic() > deadline:
            raise CreateRefused(
                f"the template's ready command did not succeed within {start.ready_timeout:g} s"
            )
        time.sleep(READY_INTERVAL)


def _ended(proc: GuestProcess, timeout: float) -> ExitStatus | None:
    try:
        return proc.wait(timeout=timeout)
    except TimeoutError:
        return None


def _said(proc: GuestProcess) -> str:
    said = b"".join(data for _, data in proc.output())[-800:]
    return said.decode(errors="replace").strip()
