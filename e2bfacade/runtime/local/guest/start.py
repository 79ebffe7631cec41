"""A template's start command, run in each new (or cold-booted) sandbox of it."""

from __future__ import annotations

import time

from e2bfacade.runtime.base import CreateRefused, GuestFileError, ProcessSpec, StartCommand
from e2bfacade.runtime.guest import Guest

# Where a start command finds the sandbox's env vars when they change after it started (a
# pool sandbox's claim, pools/warm.py): a JSON object; ``E2B_ENV_FILE`` names it.
GUEST_ENV_FILE = "/run/e2b/env.json"


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
        if start.ready_port is None:
            return
        deadline = time.monotonic() + start.ready_timeout
        while True:
            try:
                guest.connect_port(start.ready_port, timeout=1.0).close()
                return
            except GuestFileError:
                pass
            try:
                status = proc.wait(timeout=0.01)
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise CreateRefused(
                        f"the template's start command did not open port "
                        f"{start.ready_port} within {start.ready_timeout:g} s"
                    ) from None
                continue
            said = b"".join(data for _, data in proc.output())[-800:]
            raise CreateRefused(
                f"the template's start command exited (status {status.exit_code}) before "
                f"port {start.ready_port} opened: {said.decode(errors='replace').strip()}"
            )
    finally:
        proc.close()
