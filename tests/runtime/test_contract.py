"""The runtime contract: what every driver in the registry must do, through the interface
of ``e2bfacade.runtime.base`` alone (no driver internals, no host probes — those are the
driver's own tests). A new driver joins the registry and must pass this file unchanged.

Each test runs once per registered driver, but a test of the host layer that a driver
shares with the local one (not marked ``sandboxer``) runs on the local driver only; a driver
this host cannot run is skipped with its own reason (the local driver needs root,
namespaces and cgroups).
"""

from __future__ import annotations

import errno
import io
import signal
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from e2bfacade.runtime import registry
from e2bfacade.runtime.base import (
    BUILTIN_IMAGE,
    Capability,
    CreateRefused,
    FileType,
    GuestFileError,
    ImageNotFound,
    NetworkPolicy,
    ProcessNotFound,
    ProcessSpec,
    PtySize,
    Runtime,
    RuntimeConflict,
    SandboxNotFound,
    SandboxSpec,
    SandboxState,
    Stream,
)
from e2bfacade.runtime.guest import run_process
from tests.support.waiting import eventually

# Drivers built on the local driver's host layer (the root's layout and records, images,
# disks, cgroups): what they share is tested once, on "local"; a test marked ``sandboxer``
# (processes, pause and resume, snapshots, the guest's files as the agent reaches them)
# runs on each of them.
SHARING_THE_LOCAL_HOST_LAYER = {"gvisor"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = registry.driver_names()
    if not metafunc.definition.get_closest_marker("sandboxer"):
        names = [name for name in names if name not in SHARING_THE_LOCAL_HOST_LAYER]
    metafunc.parametrize("driver_name", names)


@pytest.fixture
def driver(driver_name: str, request: pytest.FixtureRequest) -> Runtime:
    if driver_name in ("local", "gvisor"):
        # The driver's session runtime (tests/runtime/conftest.py): one root, cleaned up
        # thoroughly at the end of the session (gvisor: skipped where runsc is missing).
        rt: Runtime = request.getfixturevalue(
            "runtime" if driver_name == "local" else "gvisor_runtime"
        )
        return rt
    pytest.skip(f"no test root is set up for driver {driver_name!r}")  # pragma: no cover


@pytest.fixture
def make_sandbox(driver: Runtime) -> Iterator[Callable[..., str]]:
    made: list[str] = []

    def make(**spec: object) -> str:
        sandbox_id = f"c{uuid.uuid4().hex[:12]}"
        made.append(sandbox_id)
        driver.create(SandboxSpec(sandbox_id, BUILTIN_IMAGE, **spec))  # type: ignore[arg-type]
        return sandbox_id

    yield make
    for sandbox_id in made:
        driver.kill(sandbox_id)


def sh(driver: Runtime, sandbox_id: str, script: str, **spec: object) -> tuple[int, str, str]:
    result = run_process(
        driver.guest(sandbox_id),
        ProcessSpec(("sh", "-c", script), timeout=30, **spec),  # type: ignore[arg-type]
    )
    return result.exit_code, result.stdout.decode(), result.stderr.decode()


# ----------------------------------------------------------------------------- lifecycle
@pytest.mark.sandboxer
def test_a_driver_names_itself_and_declares_its_capabilities(
    driver: Runtime, driver_name: str
) -> None:
    assert driver.name == driver_name
    assert isinstance(driver.capabilities, frozenset)
    assert all(isinstance(c, Capability) for c in driver.capabilities)


def test_create_is_idempotent_by_id(driver: Runtime, make_sandbox: Callable[..., str]) -> None:
    sandbox_id = make_sandbox()
    again = driver.create(SandboxSpec(sandbox_id, BUILTIN_IMAGE))
    assert again.adopted is True and again.state is SandboxState.RUNNING
    assert [s.sandbox_id for s in driver.list()].count(sandbox_id) == 1


def test_create_from_a_missing_image_allocates_nothing(driver: Runtime) -> None:
    sandbox_id = f"c{uuid.uuid4().hex[:12]}"
    with pytest.raises(ImageNotFound):
        driver.create(SandboxSpec(sandbox_id, "no-such-image"))
    with pytest.raises(SandboxNotFound):
        driver.status(sandbox_id)


@pytest.mark.sandboxer
def test_a_network_policy_the_driver_cannot_honour_is_refused(driver: Runtime) -> None:
    if Capability.INTERNET_ACCESS in driver.capabilities:
        pytest.skip("this driver gives sandboxes internet access")
    sandbox_id = f"c{uuid.uuid4().hex[:12]}"
    with pytest.raises(CreateRefused):
        driver.create(
            SandboxSpec(sandbox_id, BUILTIN_IMAGE, network=NetworkPolicy(allow_internet=True))
        )
    with pytest.raises(SandboxNotFound):
        driver.status(sandbox_id)


@pytest.mark.sandboxer
def test_pause_resume_and_kill(driver: Runtime, make_sandbox: Callable[..., str]) -> None:
    sandbox_id = make_sandbox()
    driver.pause(sandbox_id)
    assert driver.status(sandbox_id).state is SandboxState.PAUSED
    with pytest.raises(RuntimeConflict):
        driver.pause(sandbox_id)
    with pytest.raises(RuntimeConflict):  # a paused guest runs nothing
        driver.guest(sandbox_id).start_process(ProcessSpec(("true",)))
    driver.resume(sandbox_id)
    assert driver.status(sandbox_id).state is SandboxState.RUNNING
    assert driver.kill(sandbox_id) is True
    assert driver.kill(sandbox_id) is False
    with pytest.raises(SandboxNotFound):
        driver.status(sandbox_id)


def test_live_ids_are_the_listed_sandboxes_that_are_not_dead(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    running, paused, killed = make_sandbox(), make_sandbox(), make_sandbox()
    driver.pause(paused)
    driver.kill(killed)
    for _ in range(2):  # asked again: what a driver keeps between calls must hold too
        live = driver.live_ids()
        assert {running, paused} <= live and killed not in live
        listed = {i.sandbox_id for i in driver.list() if i.state is not SandboxState.DEAD}
        assert live == listed
    driver.kill(running)
    assert running not in driver.live_ids()
    assert driver.sweep(seen_live=driver.live_ids()) == []  # nothing dead was left


@pytest.mark.sandboxer
def test_a_snapshot_carries_files_into_a_new_sandbox(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    a = make_sandbox()
    driver.guest(a).write_file("/home/user/kept.txt", [b"from a\n"])
    image_id = f"snap{uuid.uuid4().hex[:10]}"
    info = driver.snapshot(a, image_id)
    assert info.parent == BUILTIN_IMAGE and info.image_id == image_id
    assert driver.snapshot(a, image_id).image_id == image_id  # idempotent by image id
    b = f"c{uuid.uuid4().hex[:12]}"
    try:
        driver.create(SandboxSpec(b, image_id))
        assert b"".join(driver.guest(b).read_file("/home/user/kept.txt")) == b"from a\n"
    finally:
        driver.kill(b)
        driver.kill(a)
        driver.delete_image(image_id)


def test_an_imported_archive_becomes_an_image(driver: Runtime) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"hello\n"
        member = tarfile.TarInfo("etc/greeting")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    buf.seek(0)
    image_id = f"imp{uuid.uuid4().hex[:10]}"
    info = driver.import_image(image_id, buf)
    try:
        assert info.image_id == image_id and info.parent is None and info.size_bytes > 0
        assert image_id in driver.list_images()
    finally:
        assert driver.delete_image(image_id) is True
    assert driver.delete_image(image_id) is False


def test_metrics_describe_a_live_sandbox(driver: Runtime, make_sandbox: Callable[..., str]) -> None:
    sandbox_id = make_sandbox(cpu_count=1, memory_mb=128)
    m = driver.metrics(sandbox_id)
    assert m.cpu_count == 1 and m.mem_total == 128 * 1024 * 1024 and m.pids >= 1


# ----------------------------------------------------------------------------- processes
@pytest.mark.sandboxer
def test_a_process_gets_output_exit_code_and_stdin(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    result = run_process(
        driver.guest(sandbox_id),
        ProcessSpec(("sh", "-c", "tr a-z A-Z; echo err >&2; exit 3"), stdin=True),
        stdin=b"hello\n",
    )
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"HELLO\n", b"err\n")
    assert result.signal is None


@pytest.mark.sandboxer
def test_a_process_runs_as_the_default_user_in_its_home_with_the_sandbox_env(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox(env_vars={"FROM_SANDBOX": "s", "BOTH": "sandbox"})
    code, out, _ = sh(
        driver,
        sandbox_id,
        'echo "$(id -un) $(pwd) $HOME $FROM_SANDBOX $BOTH $FROM_PROCESS"',
        env={"BOTH": "process", "FROM_PROCESS": "p"},
    )
    assert code == 0
    assert out.split() == ["user", "/home/user", "/home/user", "s", "process", "p"]
    code, out, _ = sh(driver, sandbox_id, "id -u; pwd", user="root")
    assert out.split() == ["0", "/root"]


@pytest.mark.sandboxer
def test_a_process_sees_nothing_of_the_hosts_environment(
    driver: Runtime, make_sandbox: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2BT_HOST_SECRET", "must-not-leak")
    sandbox_id = make_sandbox()
    # The init's environment may be unreadable altogether (the local driver's init is not
    # dumpable); where it is readable, it holds nothing of the host's.
    code, out, _ = sh(driver, sandbox_id, "env; cat /proc/1/environ; true", user="root")
    assert code == 0 and "must-not-leak" not in out


@pytest.mark.sandboxer
def test_an_unknown_user_is_refused(driver: Runtime, make_sandbox: Callable[..., str]) -> None:
    sandbox_id = make_sandbox()
    with pytest.raises(GuestFileError) as exc:
        driver.guest(sandbox_id).start_process(ProcessSpec(("true",), user="nobody-here"))
    assert exc.value.errno == errno.ENOENT


@pytest.mark.sandboxer
def test_a_lifetime_kills_the_process_and_its_group(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    started = time.monotonic()
    result = run_process(
        driver.guest(sandbox_id), ProcessSpec(("sh", "-c", "sleep 41 & sleep 42"), timeout=0.3)
    )
    assert result.signal == signal.SIGKILL and time.monotonic() - started < 5
    _, out, _ = sh(driver, sandbox_id, "ps -e -o args=")
    assert "sleep 41" not in out and "sleep 42" not in out


@pytest.mark.sandboxer
def test_wait_returns_when_the_process_ends_even_if_a_child_holds_its_output(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    proc = driver.guest(sandbox_id).start_process(ProcessSpec(("sh", "-c", "sleep 30 & exit 4")))
    try:
        assert proc.wait(timeout=5).exit_code == 4
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.close()


@pytest.mark.sandboxer
def test_wait_with_a_timeout_raises_while_the_process_runs(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    proc = driver.guest(sandbox_id).start_process(ProcessSpec(("sleep", "30")))
    try:
        with pytest.raises(TimeoutError):
            proc.wait(timeout=0.2)
        assert proc.pid > 1  # a guest pid: the sandbox's init is 1
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=5)
        assert status.signal == signal.SIGTERM and status.exit_code == 128 + signal.SIGTERM
    finally:
        proc.close()


@pytest.mark.sandboxer
def test_output_is_streamed_as_it_comes_and_bounded_when_collected(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    proc = driver.guest(sandbox_id).start_process(
        ProcessSpec(("sh", "-c", "echo first; sleep 30"), timeout=30)
    )
    try:
        stream, data = next(iter(proc.output()))  # arrives long before the process ends
        assert (stream, data) == (Stream.STDOUT, b"first\n")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.close()
    result = run_process(
        driver.guest(sandbox_id),
        ProcessSpec(("head", "-c", str(8 << 20), "/dev/zero"), timeout=30),
        max_output=1 << 20,
    )
    assert result.exit_code == 0 and result.truncated and len(result.stdout) == 1 << 20


@pytest.mark.sandboxer
def test_a_pty_process_has_a_terminal_of_the_asked_size(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    if Capability.PTY not in driver.capabilities:
        pytest.skip("this driver has no pty support")
    sandbox_id = make_sandbox()
    proc = driver.guest(sandbox_id).start_process(
        ProcessSpec(
            ("sh", "-c", "stty size; read line; stty size; echo got $line"),
            pty=PtySize(cols=80, rows=24),
            stdin=True,
            timeout=30,
        ),
    )
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(d for _, d in proc.output()))
    reader.start()
    try:
        eventually(
            lambda: b"".join(chunks),
            until=lambda out: b"24 80" in out,
            within=10,
            every=0.01,
            what="the first size printed",
        )
        proc.resize(PtySize(cols=100, rows=30))
        proc.write_stdin(b"typed\n")
        assert proc.wait(timeout=10).exit_code == 0
        reader.join(timeout=10)
    finally:
        proc.close()
    text = b"".join(chunks).decode()
    assert "24 80" in text and "30 100" in text and "got typed" in text


# --------------------------------------------------------------------------------- files
@pytest.mark.sandboxer
def test_a_process_outlives_its_handle_and_is_reached_by_pid(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    script = "while read line; do echo got $line; done; echo closed"
    spec = ProcessSpec(
        ("sh", "-c", script), env={"ASKED": "1"}, cwd="/tmp", stdin=True, timeout=60, tag="t1"
    )
    proc = driver.guest(sandbox_id).start_process(spec)
    pid = proc.pid
    proc.close()  # the caller goes away: the process does not
    listed = {p.pid: p for p in driver.guest(sandbox_id).list_processes()}
    assert pid in listed, listed
    info = listed[pid]
    assert (info.argv, info.cwd, info.tag, dict(info.env)) == (
        spec.argv,
        "/tmp",
        "t1",
        {"ASKED": "1"},
    )
    followers = [driver.guest(sandbox_id).connect_process(pid) for _ in range(2)]
    driver.guest(sandbox_id).process_stdin(pid, b"one\n")
    driver.guest(sandbox_id).process_close_stdin(pid)
    for follower in followers:  # every follower gets all of it
        out = b"".join(data for _, data in follower.output())
        assert out == b"got one\nclosed\n", out
        assert follower.wait(timeout=5).exit_code == 0
        follower.close()
    assert pid not in {p.pid for p in driver.guest(sandbox_id).list_processes()}
    late = driver.guest(sandbox_id).connect_process(pid)  # ended moments ago: its end, at once
    assert list(late.output()) == [] and late.wait(timeout=1).exit_code == 0
    late.close()
    with pytest.raises(ProcessNotFound):
        driver.guest(sandbox_id).process_signal(pid, signal.SIGKILL)
    with pytest.raises(ProcessNotFound):
        driver.guest(sandbox_id).connect_process(999_999)


@pytest.mark.sandboxer
def test_a_process_is_signalled_by_pid(driver: Runtime, make_sandbox: Callable[..., str]) -> None:
    sandbox_id = make_sandbox()
    proc = driver.guest(sandbox_id).start_process(ProcessSpec(("sleep", "60"), timeout=60))
    driver.guest(sandbox_id).process_signal(proc.pid, signal.SIGKILL)
    status = proc.wait(timeout=5)
    assert status.signal == signal.SIGKILL
    proc.close()


@pytest.mark.sandboxer
def test_write_creates_parents_owned_by_the_user_and_read_returns_it(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    entry = driver.guest(sandbox_id).write_file("deep/er/note.txt", [b"one ", b"two"])
    assert entry.path == "/home/user/deep/er/note.txt" and entry.type is FileType.FILE
    assert entry.size == 7 and entry.owner == "user" and entry.name == "note.txt"
    assert driver.guest(sandbox_id).stat("/home/user/deep").owner == "user"
    assert b"".join(driver.guest(sandbox_id).read_file("~/deep/er/note.txt")) == b"one two"
    _, out, _ = sh(driver, sandbox_id, "stat -c '%U %a' deep deep/er/note.txt")
    assert out.split() == ["user", "755", "user", "644"]


def test_list_dir_honours_depth(driver: Runtime, make_sandbox: Callable[..., str]) -> None:
    sandbox_id = make_sandbox()
    sh(driver, sandbox_id, "mkdir -p t/a/b && touch t/f t/a/g t/a/b/h && ln -s /etc t/l")
    one = {e.path: e.type for e in driver.guest(sandbox_id).list_dir("t")}
    assert one == {
        "/home/user/t/a": FileType.DIRECTORY,
        "/home/user/t/f": FileType.FILE,
        "/home/user/t/l": FileType.SYMLINK,
    }
    two = {e.path for e in driver.guest(sandbox_id).list_dir("t", depth=2)}
    assert two == set(one) | {"/home/user/t/a/b", "/home/user/t/a/g"}
    link = driver.guest(sandbox_id).stat("t/l")
    assert link.type is FileType.SYMLINK and link.symlink_target == "/etc"


@pytest.mark.sandboxer
def test_make_dir_move_and_remove(driver: Runtime, make_sandbox: Callable[..., str]) -> None:
    sandbox_id = make_sandbox()
    assert driver.guest(sandbox_id).make_dir("x/y") is True
    assert driver.guest(sandbox_id).make_dir("x/y") is False
    moved = driver.guest(sandbox_id).move("x", "z")
    assert moved.path == "/home/user/z" and moved.type is FileType.DIRECTORY
    with pytest.raises(GuestFileError) as exc:
        driver.guest(sandbox_id).stat("x")
    assert exc.value.errno == errno.ENOENT
    driver.guest(sandbox_id).remove("z")
    driver.guest(sandbox_id).remove("z")  # missing is fine
    code, _, _ = sh(driver, sandbox_id, "test -e z")
    assert code == 1


@pytest.mark.sandboxer
def test_file_operations_use_the_users_permissions(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    driver.guest(sandbox_id).write_file("/root/secret", [b"root only"], user="root")
    for op in (
        lambda: b"".join(driver.guest(sandbox_id).read_file("/root/secret")),
        lambda: driver.guest(sandbox_id).write_file("/etc/planted", [b"x"]),
        lambda: driver.guest(sandbox_id).remove("/root/secret"),
    ):
        with pytest.raises(GuestFileError) as exc:
            op()
        assert exc.value.errno == errno.EACCES
    assert driver.guest(sandbox_id).stat("/root/secret", user="root").owner == "root"


@pytest.mark.sandboxer
def test_guest_symlinks_resolve_inside_the_guest(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    # Absolute and relative links that would reach host files if resolved on the host.
    sh(driver, sandbox_id, "ln -s / up; ln -s ../../../../../../.. rel; echo guest > /tmp/m")
    assert b"".join(driver.guest(sandbox_id).read_file("up/tmp/m")) == b"guest\n"
    assert b"".join(driver.guest(sandbox_id).read_file("rel/tmp/m")) == b"guest\n"
    with pytest.raises(GuestFileError):  # the guest has no /proc/1/root of ours to follow
        driver.guest(sandbox_id).stat("/proc/1/root/etc")


def test_reading_a_directory_or_a_missing_file_says_why(
    driver: Runtime, make_sandbox: Callable[..., str]
) -> None:
    sandbox_id = make_sandbox()
    for path, expected in (("/home", errno.EISDIR), ("/nope/none", errno.ENOENT)):
        with pytest.raises(GuestFileError) as exc:
            b"".join(driver.guest(sandbox_id).read_file(path))
        assert exc.value.errno == expected
