"""gVisor's ``runsc``, the gVisor driver's launcher: its command line, called with the state
of one runtime root (``SANDBOX_ROOT/runsc``).

Two things of this host shape every call (measured, docs/runtime.md "The gVisor driver"):

- ``runsc create``, ``start`` and ``restore`` set up the sandbox's network from its network
  namespace, and refuse when they think they run in the host's ("cannot run with network
  enabled in root network namespace"): runsc decides that from whether
  ``/proc/sys/net/core/rmem_default`` exists, which on this kernel it does in every
  namespace. Those calls run in a private mount namespace with an empty tmpfs over
  ``/proc/sys/net`` (``unshare``), which the sandbox's processes never see.
- ``create`` and ``restore --detach`` leave the sandbox holding the caller's standard
  streams: every call gets /dev/null for stdin and stdout, and a file for stderr, so no
  pipe is ever left open to a caller that waits for it to close.

A sandbox's processes (the sentry, the gofer) are started in the sandbox's own cgroups
(``--ignore-cgroups``: the call joins them first), so its memory, pid and CPU limits and
the root's caps apply to them as to a local sandbox's processes.
"""

from __future__ import annotations

import glob
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2bfacade.runtime.base import RuntimeBusy, RuntimeUnavailable, SandboxRuntimeError
from e2bfacade.runtime.local import build

DEBUG_ENV = "E2BFACADE_RUNSC_DEBUG"
TIMEOUT = 60.0  # a create or restore takes well under a second; a wedged runsc must not hold us

# Joins the sandbox's cgroups (the files given first, up to "--"), hides /proc/sys/net from
# runsc's root-namespace test, and runs runsc. $0 is the runsc binary.
_WRAPPER = (
    'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; '
    'mount -t tmpfs -o size=4k,mode=555 none /proc/sys/net && exec "$0" "$@"'
)


# The keepers still running (each reaps one sandbox's processes until they end).
_keepers: list[subprocess.Popen[bytes]] = []


class RunscError(SandboxRuntimeError):
    """runsc failed; ``message`` has the last line it wrote."""


def binary() -> str:
    found = shutil.which("runsc") or (
        "/usr/bin/runsc" if os.path.exists("/usr/bin/runsc") else None
    )
    if found is None:
        raise RuntimeUnavailable(
            "the gvisor runtime needs runsc, which is not installed (scripts/setup.sh "
            "installs Debian's runsc package)"
        )
    return found


class Runsc:
    """runsc with one root's state directory and this driver's settings: the ptrace
    platform (no KVM on these hosts), netstack on the sandbox's own link, and host files
    shared with the host (the runtime reads and writes a sandbox's files from outside)."""

    def __init__(self, state_dir: Path) -> None:
        self.binary = binary()
        self.state_dir = state_dir
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _flags(self) -> list[str]:
        flags = [
            f"--root={self.state_dir}",
            "--network=sandbox",
            "--file-access=shared",
            "--overlay2=none",
            "--ignore-cgroups",
            # The sentry without host privileges: it runs as nobody, with no capabilities,
            # and reaches files only through the gofer (directfs gives it host root's file
            # capabilities, so an escape from gVisor's kernel would be host root).
            "--directfs=false",
            # The bundle's seccomp filter applies to the guest (no user namespaces).
            "--oci-seccomp",
            # A checkpoint resets the guest's open TCP connections instead of refusing to
            # save them (E2B's pause cuts them too); the host resets its side first.
            "--net-disconnect-ok",
        ]
        # An operator's switch for diagnosing a guest: runsc's logs, with every system call
        # the guest makes, in that directory (large: never on in production).
        debug = os.environ.get(DEBUG_ENV)
        if debug:
            flags += ["--debug", "--strace", f"--debug-log={debug.rstrip('/')}/"]
        return flags

    def run(
        self,
        *args: str,
        cgroup_procs: Sequence[str] = (),
        network: bool = False,
        timeout: float = TIMEOUT,
        keeper: Path | None = None,
    ) -> str:
        """Run ``runsc <flags> <args>``; its stdout. ``network``: the call sets up the
        sandbox's network (create, start, restore), run as the module's header says, in
        the groups of ``cgroup_procs`` first. ``keeper``: the runtime's helper, to run the
        call under (``sandboxd keep``) when it leaves processes behind (create, restore),
        so that they are reaped the moment they end."""
        argv = [self.binary, *self._flags(), *args]
        if network or cgroup_procs:
            argv = [
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                _WRAPPER,
                *argv[:1],
                *cgroup_procs,
                "--",
                *argv[1:],
            ]
        if keeper is not None:
            self._kept([str(keeper), "keep", "--", *argv], args[0], timeout)
            return ""
        with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
            try:
                done = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise RuntimeBusy(f"runsc {args[0]} did not finish in {timeout:.0f} s") from None
            out.seek(0)
            err.seek(0)
            text = err.read(65536).decode(errors="replace").strip()
            if done.returncode != 0:
                last = text.splitlines()[-1] if text else f"exit status {done.returncode}"
                raise RunscError(f"runsc {args[0]}: {last}")
            return out.read(1 << 20).decode(errors="replace")

    def _kept(self, argv: list[str], what: str, timeout: float) -> None:
        """Run ``argv`` (a keeper and its command), reading how the command ended from the
        keeper, which stays behind reaping what the command left."""
        with tempfile.TemporaryFile() as err:
            keeper = build.run_helper(
                lambda: subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
                )
            )
            assert keeper.stdout is not None
            deadline = time.monotonic() + timeout
            data = b""
            with keeper.stdout:
                while not data.endswith(b"\n") and len(data) < 64:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([keeper.stdout], [], [], left)[0]:
                        keeper.kill()
                        raise RuntimeBusy(f"runsc {what} did not finish in {timeout:.0f} s")
                    chunk = os.read(keeper.stdout.fileno(), 64)
                    if not chunk:
                        break
                    data += chunk
            # Left to reap (subprocess polls the abandoned ones on its next start).
            _keepers[:] = [k for k in _keepers if k.poll() is None] + [keeper]
            try:
                code = os.waitstatus_to_exitcode(int(data))
            except ValueError:
                code = -1
            if code != 0:
                err.seek(0)
                text = err.read(65536).decode(errors="replace").strip()
                last = text.splitlines()[-1] if text else f"exit status {code}"
                raise RunscError(f"runsc {what}: {last}")

    def state(self, container_id: str) -> dict[str, Any] | None:
        """``runsc state``: its status and the sandbox process's pid; None when runsc
        knows no such container."""
        try:
            return dict(json.loads(self.run("state", container_id, timeout=10)))
        except RunscError:
            return None
        except ValueError:
            return None

    def known(self, container_id: str) -> bool:
        """Whether runsc holds state for the container (its state file: no call needed)."""
        return any(self.state_dir.glob(f"{glob.escape(container_id)}_sandbox:*.state"))

    def containers(self) -> set[str]:
        """The ids of the containers runsc holds state for."""
        return {p.name.split("_sandbox:", 1)[0] for p in self.state_dir.glob("*_sandbox:*.state")}

    def delete(self, container_id: str) -> None:
        """Remove the container whatever its state (killing it first); gone is fine."""
        if not self.known(container_id):
            return
        try:
            self.run("delete", "--force", container_id, timeout=30)
        except RunscError:
            if self.state(container_id) is not None:
                raise
