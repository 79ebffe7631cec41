"""A guest cannot read the control plane's secrets: not from its init's environment, not
from its own, not from any process it can see. The sandbox is made through the SDK on a
live server whose environment holds SECRET_KEY and DATABASE_URL, as a deployment's does;
the guest's view is then read from inside, as guest root."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from e2b import Sandbox

from e2bfacade.runtime.base import ProcessSpec
from e2bfacade.runtime.guest import run_process
from e2bfacade.runtime.local import LocalRuntime
from tests.runtime.helpers import any_daemon_pids
from tests.support.live_server import LiveServer

# Every environment a guest process could read: its init's, its own, and every process
# of its pid namespace.
READ_ALL_ENVIRONMENTS = "for f in /proc/[0-9]*/environ; do cat $f; echo; done; env"


def secrets_of(server: LiveServer) -> list[str]:
    values = [server.env["SECRET_KEY"], server.env["DATABASE_URL"]]
    assert all(len(v) > 8 for v in values)
    return values


def test_a_guest_reads_no_control_plane_secret(
    live_server_e2b: LiveServer, make_sandbox: Callable[..., Sandbox]
) -> None:
    sandbox = make_sandbox(envs={"MINE": "visible"})
    runtime = LocalRuntime(live_server_e2b.sandbox_root)
    result = run_process(
        runtime.guest(sandbox.sandbox_id),
        ProcessSpec(("sh", "-c", READ_ALL_ENVIRONMENTS), user="root", timeout=30),
    )
    assert result.exit_code == 0, result
    seen = result.stdout.decode(errors="replace")
    assert "MINE=visible" in seen  # the sandbox's own env vars do reach its processes
    for secret in secrets_of(live_server_e2b):
        assert secret not in seen
    assert "SECRET_KEY" not in seen and "DATABASE_URL" not in seen


def test_the_sandbox_launcher_runs_without_the_services_environment(
    live_server_e2b: LiveServer, make_sandbox: Callable[..., Sandbox]
) -> None:
    make_sandbox()  # the launcher daemon exists once a sandbox was made
    pids = any_daemon_pids(Path(live_server_e2b.sandbox_root))
    assert pids
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        for secret in secrets_of(live_server_e2b):
            assert secret not in environ
