"""The gvisor driver through the unmodified Python SDK, on a live server of its own
(``SANDBOX_RUNTIME=gvisor``): a template builds (its account changes included) and its
sandbox runs; a pause keeps a process's memory and ``connect`` resumes it,
across a power cut of the whole service; ``create_snapshot()`` and ``fork()`` start copies
that continue the source's processes; and the same requests on the local driver get a 400,
not a silent files-only answer. Skipped where runsc is not installed."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import pytest
from e2b import Sandbox, SandboxException, Template

from e2bfacade.runtime.gvisor.driver import installed
from tests.contract.template_support import unique
from tests.support.live_checks import sandbox_detail
from tests.support.live_fixtures import point_sdk, started
from tests.support.live_server import LiveServer
from tests.support.runtime_support import power_cut
from tests.support.waiting import eventually

pytestmark = pytest.mark.skipif(not installed(), reason="runsc is not installed")

# A process whose state is only in its memory: a token drawn at start and a counter.
COUNTER = (
    "import secrets, time\n"
    "token, n = secrets.token_hex(8), 0\n"
    "while True:\n"
    "    n += 1\n"
    "    open('/tmp/state', 'w').write(f'{token} {n}')\n"
    "    time.sleep(0.05)\n"
)


@pytest.fixture(scope="module")
def gvisor_server() -> Iterator[LiveServer]:
    with started(workers=2, SANDBOX_RUNTIME="gvisor", API_RATE_LIMIT="0") as live:
        yield live


@pytest.fixture
def sdk(gvisor_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    point_sdk(monkeypatch, gvisor_server, gvisor_server.api_key)
    return gvisor_server


def start_counter(sandbox: Sandbox) -> tuple[str, int]:
    sandbox.commands.run(f"python3 -c {shlex.quote(COUNTER)}", background=True)
    return read_state(sandbox)


def read_state(sandbox: Sandbox) -> tuple[str, int]:
    parts = eventually(
        lambda: (
            sandbox.files.read("/tmp/state").split() if sandbox.files.exists("/tmp/state") else []
        ),
        until=lambda parts: len(parts) == 2,
        within=20,
        every=0.1,
        what="the counter's state",
    )
    return parts[0], int(parts[1])


def counted_past(sandbox: Sandbox, n: int) -> tuple[str, int]:
    """The counter's state once it has counted past ``n``: its process runs on."""
    return eventually(
        lambda: read_state(sandbox), until=lambda state: state[1] > n, within=10, what=f"{n}+1"
    )


def test_a_pause_keeps_memory_and_connect_continues_the_process(sdk: LiveServer) -> None:
    sandbox = Sandbox.create(timeout=300)
    try:
        token, n = start_counter(sandbox)
        assert sandbox.pause() is True
        info = sandbox_detail(sdk.url, sdk.api_key, sandbox.sandbox_id)
        assert (info["state"], info["pauseMode"]) == ("paused", "full")
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        again = counted_past(resumed, n)
        assert again[0] == token and again[1] > n
    finally:
        sandbox.kill()


def test_a_snapshot_and_a_fork_carry_the_running_process(sdk: LiveServer) -> None:
    source = Sandbox.create(timeout=300)
    made: list[Sandbox] = [source]
    try:
        token, _ = start_counter(source)
        snapshot = source.create_snapshot()
        from_snapshot = Sandbox.create(snapshot.snapshot_id, timeout=300)
        made.append(from_snapshot)
        forks = source.fork(count=2, timeout=300)
        for fork in forks:
            assert isinstance(fork, Sandbox), fork
            made.append(fork)
        ids = {s.sandbox_id for s in made}
        assert len(ids) == 4
        for copy in made[1:]:
            assert read_state(copy)[0] == token  # the same process, continued
            assert copy.commands.run("hostname").stdout.strip() == copy.sandbox_id
        files_only = Sandbox.create(source.create_snapshot(mode="filesystem").snapshot_id)
        made.append(files_only)
        assert files_only.commands.run("ps -eo comm | grep -cx python3 || true").stdout == "0\n"
    finally:
        for sandbox in made:
            sandbox.kill()


def test_the_local_driver_refuses_a_memory_snapshot_by_name(
    live_server_e2b: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2B_API_URL", live_server_e2b.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", live_server_e2b.sandbox_url)
    monkeypatch.setenv("E2B_API_KEY", live_server_e2b.api_key)
    sandbox = Sandbox.create()
    try:
        with pytest.raises(SandboxException, match="memory snapshots"):
            sandbox.create_snapshot(mode="full")
    finally:
        sandbox.kill()


def test_every_kind_of_sandbox_answers_a_connect_made_right_after_a_power_cut(
    sdk: LiveServer,
) -> None:
    """Clients reconnect before any reconcile has run: a running sandbox and one paused
    without memory come back from their disks, one paused with memory from its checkpoint;
    each answers the data plane at once (never a 201 for a sandbox that does not run)."""
    made = {mode: Sandbox.create(timeout=600) for mode in ("running", "memory", "filesystem")}
    for mode, sandbox in made.items():
        sandbox.files.write("/home/user/marker.txt", mode)
        sandbox.commands.run("sync")
    token, n = start_counter(made["memory"])
    assert made["memory"].pause() is True
    assert made["filesystem"].pause(keep_memory=False) is True
    sdk.kill()
    power_cut(sdk.sandbox_root)
    sdk.start()  # no reconcile: the connect is the first to meet each sandbox
    for mode, sandbox in made.items():
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=600)
        assert resumed.files.read("/home/user/marker.txt") == mode
        assert resumed.commands.run("echo alive").stdout == "alive\n", mode
    again = read_state(Sandbox.connect(made["memory"].sandbox_id, timeout=600))
    assert again[0] == token and again[1] > n
    for sandbox in made.values():
        sandbox.kill()


def test_a_memory_pause_survives_a_power_cut_of_the_whole_service(sdk: LiveServer) -> None:
    """Last in the module: it cuts the power of the module's server."""
    sandbox = Sandbox.create(timeout=600)
    token, n = start_counter(sandbox)
    assert sandbox.pause() is True
    sdk.kill()
    power_cut(sdk.sandbox_root)
    sdk.start()
    sdk.run_worker_once()
    info = sandbox_detail(sdk.url, sdk.api_key, sandbox.sandbox_id)
    assert (info["state"], info["pauseMode"]) == ("paused", "full"), info
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=600)
    again = counted_past(resumed, n)
    assert again[0] == token and again[1] > n
    resumed.kill()


def test_a_template_builds_on_gvisor_and_its_sandbox_runs_it(sdk: LiveServer) -> None:
    name = unique("gv-tpl")
    logs: list[str] = []
    template = (
        Template()
        .from_template("base")
        .run_cmd("echo built-as-$(id -un) > /home/user/built.txt", user="user")
        .run_cmd("useradd -m -s /bin/bash builder && id -un builder", user="root")
        .set_envs({"GVISOR_BUILT": "yes"})
    )
    Template.build(
        template, f"{name}:v1", cpu_count=1, memory_mb=512,
        on_build_logs=lambda e: logs.append(e.message),
    )  # fmt: skip
    assert any("[finalize]" in line for line in logs), logs
    sandbox = Sandbox.create(f"{name}:v1", timeout=120)
    try:
        out = sandbox.commands.run(
            "cat /home/user/built.txt; echo $GVISOR_BUILT; id -un; id -un builder"
        )
        assert out.stdout == "built-as-user\nyes\nuser\nbuilder\n", out
    finally:
        sandbox.kill()
