"""The data plane through the unmodified Python SDK (sync): ``commands``, ``files`` and
``is_running`` against a live server, with only the exports ``scripts/serve.sh`` prints
(``E2B_API_URL``, ``E2B_API_KEY``, ``E2B_SANDBOX_URL``). Hostile paths included: what the
caller names resolves inside the guest, with the caller's permissions."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)

from tests.support.live_server import LiveServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("envd_env")


@pytest.fixture
def sbx(make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    return make_sandbox(envs={"FROM_CREATE": "c1"})


# ------------------------------------------------------------------------------ commands
def test_a_command_runs_as_user_in_its_home_with_the_sandbox_env(sbx: Sandbox) -> None:
    result = sbx.commands.run(
        'echo "$(whoami) $PWD $FROM_CREATE $PER_CALL $E2B_SANDBOX $E2B_SANDBOX_ID"; echo err >&2',
        envs={"PER_CALL": "p1"},
    )
    assert result.exit_code == 0
    assert result.stdout == f"user /home/user c1 p1 true {sbx.sandbox_id}\n"
    assert result.stderr == "err\n"
    assert sbx.commands.run("whoami", user="root").stdout == "root\n"
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sbx.commands.run("pwd", cwd="~").stdout == "/home/user\n"


def test_a_failing_command_raises_with_its_exit_code_and_output(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as caught:
        sbx.commands.run("echo out; echo bad >&2; exit 3")
    assert caught.value.exit_code == 3
    assert caught.value.stdout == "out\n" and caught.value.stderr == "bad\n"


def test_a_missing_cwd_and_an_unknown_user_are_refused(sbx: Sandbox) -> None:
    with pytest.raises(InvalidArgumentException, match="does not exist"):
        sbx.commands.run("true", cwd="/no/such/dir")
    with pytest.raises(AuthenticationException):
        sbx.commands.run("true", user="nobody-here")


def test_callbacks_stream_output_as_it_comes(sbx: Sandbox) -> None:
    seen: list[tuple[float, str]] = []
    sbx.commands.run(
        "echo one; sleep 0.5; echo two",
        on_stdout=lambda line: seen.append((time.monotonic(), line)),
    )
    assert [line for _, line in seen] == ["one\n", "two\n"]
    assert seen[1][0] - seen[0][0] >= 0.4  # the first line arrived before the second existed


def test_a_background_command_is_listed_reattached_and_killed(sbx: Sandbox) -> None:
    handle = sbx.commands.run(
        "for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.3; done", background=True
    )
    listed = {p.pid: p for p in sbx.commands.list()}
    assert handle.pid in listed
    assert listed[handle.pid].cmd == "/bin/bash"
    # Another client (a fresh connection to the same sandbox) follows the same process.
    other = Sandbox.connect(sbx.sandbox_id)
    follower = other.commands.connect(handle.pid)
    result = follower.wait()
    assert "tick6" in result.stdout and result.exit_code == 0
    sleeper = sbx.commands.run("sleep 60", background=True)
    assert sbx.commands.kill(sleeper.pid) is True
    with pytest.raises(CommandExitException) as caught:
        sleeper.wait()
    assert caught.value.exit_code == -1
    assert sbx.commands.kill(sleeper.pid) is False  # gone: nothing to kill


def test_stdin_is_sent_and_closed(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat; echo done", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "hello\n")
    sbx.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert result.stdout == "hello\ndone\n"


def test_the_timeout_is_the_commands_lifetime(sbx: Sandbox) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - started < 10
    eventually(
        lambda: sbx.commands.run("ps -eo args").stdout,
        until=lambda ps: "sleep 30" not in ps,
        within=5,
        every=0.1,
        what="the timed-out command ended",
    )


# --------------------------------------------------------------------------------- files
def test_files_round_trip_and_are_owned_by_the_user(sbx: Sandbox) -> None:
    info = sbx.files.write("a/b/c.txt", "hello")  # relative: under the user's home
    assert info.path == "/home/user/a/b/c.txt"
    assert sbx.files.read("/home/user/a/b/c.txt") == "hello"
    assert sbx.files.read("~/a/b/c.txt", format="bytes") == bytearray(b"hello")
    assert sbx.commands.run("stat -c %U /home/user/a /home/user/a/b/c.txt").stdout == "user\nuser\n"
    entry = sbx.files.get_info("/home/user/a/b/c.txt")
    assert (entry.name, entry.type, entry.size, entry.owner) == ("c.txt", FileType.FILE, 5, "user")
    assert entry.permissions.startswith("-rw")
    names = {e.name: e.type for e in sbx.files.list("/home/user/a", depth=2)}
    assert names == {"b": FileType.DIR, "c.txt": FileType.FILE}
    assert sbx.files.exists("/home/user/a/b/c.txt") and not sbx.files.exists("/nope")
    assert sbx.files.make_dir("/home/user/d") is True
    assert sbx.files.make_dir("/home/user/d") is False
    moved = sbx.files.rename("/home/user/a/b/c.txt", "/home/user/d/e.txt")
    assert moved.path == "/home/user/d/e.txt"
    sbx.files.remove("/home/user/d")
    assert not sbx.files.exists("/home/user/d")
    sbx.files.remove("/home/user/never-was")  # missing is fine, as in envd


def test_many_files_and_streamed_uploads(sbx: Sandbox) -> None:
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    written = sbx.files.write_files(
        [WriteEntry(path="/tmp/m/one", data="1"), WriteEntry(path="/tmp/m/two", data=b"2")]
    )
    assert sorted(w.path for w in written) == ["/tmp/m/one", "/tmp/m/two"]
    big = bytes(range(256)) * 8192  # 2 MiB
    sbx.files.write("/tmp/big", big, gzip=True)
    assert bytes(sbx.files.read("/tmp/big", format="bytes")) == big
    assert sbx.commands.run("md5sum < /tmp/big").stdout.split()[0]


def test_permissions_are_the_users(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException):
        sbx.files.write("/etc/owned-by-root", "x")
    assert sbx.files.write("/etc/as-root", "x", user="root").path == "/etc/as-root"
    with pytest.raises(SandboxException):
        sbx.files.read("/etc/shadow")


def test_hostile_paths_stay_inside_the_guest(sbx: Sandbox) -> None:
    sbx.commands.run("ln -s / /home/user/root-link && ln -s /etc/hostname /home/user/host-link")
    # ".." and links resolve in the guest: these are the guest's own files, never the host's.
    guest_hostname = sbx.commands.run("cat /etc/hostname").stdout
    assert sbx.files.read("/home/user/host-link") == guest_hostname
    assert sbx.files.read("/../../../../etc/hostname") == guest_hostname
    assert sbx.files.read("/home/user/root-link/etc/hostname") == guest_hostname
    with pytest.raises((InvalidArgumentException, SandboxException)):
        sbx.files.write("/tmp/a\x00b", "x")
    with pytest.raises((InvalidArgumentException, SandboxException)):
        sbx.files.write("/tmp/" + "n" * 10_000, "x")
    with pytest.raises(NotFoundException):
        sbx.files.read("/home/user/root-link/no/such/file")


def test_signed_urls_download_and_upload(sbx: Sandbox, envd_env: LiveServer) -> None:
    sbx.files.write("/tmp/signed.txt", "signed content")
    url = sbx.download_url("/tmp/signed.txt", use_signature_expiration=60)
    # As a browser or curl fetches it: the URL alone (its signature names the sandbox).
    got = httpx.get(url)
    assert got.status_code == 200 and got.text == "signed content"
    expired = sbx.download_url("/tmp/signed.txt", use_signature_expiration=-10)
    refused = httpx.get(expired)
    assert refused.status_code == 401 and "expired" in refused.json()["message"]
    tampered = url.replace("signed.txt", "other.txt")
    assert httpx.get(tampered, headers={"E2b-Sandbox-Id": sbx.sandbox_id}).status_code == 401
    up = sbx.upload_url("/tmp/up.txt")
    sent = httpx.post(
        up, headers={"E2b-Sandbox-Id": sbx.sandbox_id}, files={"file": ("up.txt", b"uploaded")}
    )
    assert sent.status_code == 200, sent.text
    assert sbx.files.read("/tmp/up.txt") == "uploaded"


# ---------------------------------------------------------------------- access and life
def test_tokens_open_only_their_own_sandbox(
    make_sandbox: Callable[..., Sandbox], envd_env: LiveServer
) -> None:
    a, b = make_sandbox(), make_sandbox()
    url = f"{envd_env.sandbox_url}/filesystem.Filesystem/Stat"
    body = {"path": "/tmp"}

    def stat(sandbox_id: str, token: str | None) -> httpx.Response:
        headers = {"E2b-Sandbox-Id": sandbox_id, "Connect-Protocol-Version": "1"}
        if token is not None:
            headers["X-Access-Token"] = token
        return httpx.post(url, json=body, headers=headers)

    assert stat(a.sandbox_id, a._envd_access_token).status_code == 200
    for token in (b._envd_access_token, envd_env.api_key, None, "x" * 32):
        denied = stat(a.sandbox_id, token)
        assert denied.status_code == 401, (token, denied.text)
        assert "unauthorized access" in denied.json()["message"]


def test_an_unknown_or_killed_sandbox_is_not_found(
    make_sandbox: Callable[..., Sandbox], envd_env: LiveServer
) -> None:
    missing = httpx.get(
        f"{envd_env.sandbox_url}/health", headers={"E2b-Sandbox-Id": f"x{uuid.uuid4().hex[:12]}"}
    )
    assert missing.status_code == 502 and "was not found" in missing.json()["message"]
    sbx = make_sandbox()
    assert sbx.is_running() is True
    sbx.kill()
    assert sbx.is_running() is False
    with pytest.raises(SandboxException):
        sbx.commands.run("true")


def test_a_port_inside_the_sandbox_is_forwarded(sbx: Sandbox, envd_env: LiveServer) -> None:
    sbx.commands.run("mkdir -p /tmp/www && echo served > /tmp/www/index.html")
    server = sbx.commands.run("cd /tmp/www && python3 -m http.server 8000", background=True)
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"}
    got = eventually(
        lambda: httpx.get(f"{envd_env.sandbox_url}/index.html", headers=headers),
        until=lambda got: got.status_code == 200,
        within=20,
        every=0.1,
        what="the guest's server answering",
    )
    assert got.text == "served\n"
    closed = httpx.get(
        envd_env.sandbox_url,
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8001"},
    )
    assert closed.status_code == 502 and "port is not open" in closed.json()["message"]
    sbx.commands.kill(server.pid)


def test_a_watched_directory_reports_its_changes(sbx: Sandbox) -> None:
    from e2b import FilesystemEventType

    sbx.files.make_dir("/home/user/w/sub")
    handle = sbx.files.watch_dir("/home/user/w", recursive=True)
    sbx.files.write("/home/user/w/a.txt", "a")
    sbx.files.write("/home/user/w/sub/b.txt", "b")
    sbx.files.remove("/home/user/w/a.txt")
    seen: set[tuple[str, FilesystemEventType]] = set()

    def collected() -> set[tuple[str, FilesystemEventType]]:  # each call: the new ones
        seen.update((e.name, e.type) for e in handle.get_new_events())
        return seen

    eventually(
        collected,
        until=lambda seen: (
            {
                ("a.txt", FilesystemEventType.REMOVE),
                ("sub/b.txt", FilesystemEventType.WRITE),
            }
            <= seen
        ),
        within=10,
        every=0.1,
        what="the remove and the write reported",
    )
    assert ("a.txt", FilesystemEventType.CREATE) in seen, seen
    assert ("sub/b.txt", FilesystemEventType.WRITE) in seen, seen
    assert ("a.txt", FilesystemEventType.REMOVE) in seen, seen
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()
    with pytest.raises(SandboxException):
        sbx.files.watch_dir("/home/user/no-such-dir")


def test_killing_the_sandbox_ends_its_streams_with_not_running(
    make_sandbox: Callable[..., Sandbox],
) -> None:
    from e2b import SandboxNotRunningException
    from e2b.envd.rpc import is_transport_failure

    sbx = make_sandbox()
    handle = sbx.commands.run("sleep 60", background=True)
    killer = threading.Timer(0.5, sbx.kill)
    killer.start()
    with pytest.raises(SandboxNotRunningException, match="killed or reached its end of life") as e:
        handle.wait()
    killer.join()
    # As when envd's VM goes away, the connection is reset, not ended with an error message:
    # SDKs older than this one ask /health only after a dropped connection.
    cause = e.value.__cause__
    assert isinstance(cause, Exception) and is_transport_failure(cause), repr(cause)


def test_a_paused_sandbox_keeps_its_commands_and_they_go_on_after_resume(
    make_sandbox: Callable[..., Sandbox],
) -> None:
    sbx = make_sandbox()
    handle = sbx.commands.run("for i in 1 2 3 4 5; do echo $i; sleep 0.2; done", background=True)
    time.sleep(0.3)
    assert sbx.pause()
    assert sbx.is_running() is False
    resumed = Sandbox.connect(sbx.sandbox_id)
    follower = resumed.commands.connect(handle.pid)
    result = follower.wait()
    assert result.exit_code == 0 and result.stdout.endswith("5\n")


def test_file_metadata_is_kept_listed_and_replaced(sbx: Sandbox) -> None:
    sbx.files.write("/tmp/meta.txt", "m", metadata={"Owner": "team-a", "stage": "raw"})
    assert sbx.files.get_info("/tmp/meta.txt").metadata == {"owner": "team-a", "stage": "raw"}
    listed = {e.name: e.metadata for e in sbx.files.list("/tmp")}
    assert listed["meta.txt"] == {"owner": "team-a", "stage": "raw"}
    # The guest sees the attribute itself (python3 reads it; getfattr may be absent).
    read = "import os; print(os.getxattr('/tmp/meta.txt', 'user.e2b.owner').decode())"
    assert sbx.commands.run(f'python3 -c "{read}"').stdout == "team-a\n"
    sbx.files.write("/tmp/meta.txt", "again")  # no metadata: replaced by none
    assert not sbx.files.get_info("/tmp/meta.txt").metadata
    with pytest.raises(InvalidArgumentException):
        sbx.files.write("/tmp/meta.txt", "x", metadata={"bad key": "v"})


def test_watch_events_carry_entries_when_asked(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/we")
    handle = sbx.files.watch_dir("/home/user/we", include_entry=True)
    sbx.files.write("/home/user/we/x.txt", "12345")
    entries = eventually(
        lambda: [e.entry for e in handle.get_new_events() if e.entry is not None],
        within=10,
        every=0.1,
        what="an event with its entry",
    )
    handle.stop()
    assert entries and entries[0].path == "/home/user/we/x.txt", entries


def test_a_paused_sandbox_with_auto_resume_wakes_on_its_first_request(
    make_sandbox: Callable[..., Sandbox], envd_env: LiveServer
) -> None:
    sbx = make_sandbox(lifecycle={"on_timeout": "pause", "auto_resume": True})
    assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
    sbx.commands.run("echo kept > /tmp/kept")
    assert sbx.pause()
    assert sbx.get_info().state.value == "paused"
    # No connect: the data-plane request itself resumes it, through the control plane.
    assert sbx.commands.run("cat /tmp/kept").stdout == "kept\n"
    assert sbx.get_info().state.value == "running"
    plain = make_sandbox()
    assert plain.pause()
    with pytest.raises(SandboxException):
        plain.commands.run("true")  # without autoResume a paused sandbox stays paused
