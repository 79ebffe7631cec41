"""Hostile template builds, on a server of their own (a short step timeout, a small log cap):
archives built to escape their extraction, RUN steps that reach for the host's services, fill
the disk, flood the log or never end. Steps and extraction run as guest root inside the
build sandbox, so each test asserts on the HOST that nothing outside the guest changed,
and on the guest that it got what tar makes of the archive."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.contract.template_support import (
    base_spec,
    copy_step,
    messages,
    request_build,
    run_step,
    tar_of,
    trigger,
    unique,
    upload,
    wait_build,
)
from tests.support.live_fixtures import point_sdk, started
from tests.support.live_server import LiveServer
from tests.support.waiting import eventually

STEP_TIMEOUT = 10
LOG_CAP = 300


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with started(
        workers=2,
        TEMPLATE_STEP_TIMEOUT_SECONDS=str(STEP_TIMEOUT),
        TEMPLATE_BUILD_LOG_ENTRIES=str(LOG_CAP),
    ) as live:
        yield live


@pytest.fixture(scope="module")
def raw(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url, headers={"X-API-Key": server.api_key}, timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def canary(server: LiveServer) -> Iterator[Path]:
    """A host directory outside every guest, with one file; a path the archives aim at."""
    path = server.sandbox_root.parent / "canary"
    path.mkdir()
    (path / "keep.txt").write_text("host\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def sandbox_of(server: LiveServer, ref: str) -> Iterator[Sandbox]:
    with pytest.MonkeyPatch.context() as env:
        point_sdk(env, server, server.api_key)
        sandbox = Sandbox.create(ref, timeout=60)
        try:
            yield sandbox
        finally:
            sandbox.kill()


def _root(box: Sandbox, cmd: str) -> str:
    done = box.commands.run(cmd, user="root")
    return str(done.stdout)


def _copy_build(
    raw: httpx.Client, archive: bytes, dest: str
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    name = unique("hostile")
    made = request_build(raw, name)
    digest = upload(raw, made["templateID"], archive)
    spec = base_spec(copy_step(digest, ".", dest, "root"))
    assert trigger(raw, made["templateID"], made["buildID"], spec).status_code == 202
    info, log = wait_build(raw, made["templateID"], made["buildID"])
    return made | {"alias": name}, info, log


def _host_unchanged(canary: Path) -> None:
    assert sorted(p.name for p in canary.iterdir()) == ["keep.txt"]
    assert (canary / "keep.txt").read_text() == "host\n"


# --------------------------------------------------------------------------- archives
def test_a_dot_dot_member_fails_the_copy_inside_the_guest(
    server: LiveServer, raw: httpx.Client, canary: Path
) -> None:
    token = os.urandom(4).hex()
    archive = tar_of(
        ("file", "ok.txt", "ok"),
        ("file", f"../../escape-{token}.txt", "evil"),
        ("file", f"../../{canary.name}/pwned", "evil"),
    )
    _, info, log = _copy_build(raw, archive, "/opt/dest")
    # GNU tar, in the guest, refuses the member (and the build fails at the COPY).
    assert info["status"] == "error", messages(log)
    assert info["reason"] == {
        "message": "tar: Exiting with failure status due to previous errors",
        "step": "1",
        "logEntries": info["reason"]["logEntries"],
    }
    assert f"tar: ../../escape-{token}.txt: Member name contains '..'" in messages(log)
    for host in (server.sandbox_root, server.sandbox_root.parent, Path("/"), Path("/tmp")):
        assert not (host / f"escape-{token}.txt").exists()
    _host_unchanged(canary)


def test_absolute_symlinks_are_copied_as_links_resolved_in_the_guest(
    server: LiveServer, raw: httpx.Client, canary: Path
) -> None:
    shadow = Path("/etc/shadow").read_text() if Path("/etc/shadow").exists() else ""
    archive = tar_of(
        ("file", "ok.txt", "ok"),
        ("symlink", "shadow", "/etc/shadow"),
        ("symlink", "root-link", str(server.sandbox_root)),
        ("symlink", "canary-link", str(canary)),
    )
    made, info, log = _copy_build(raw, archive, "/opt/dest")
    assert info["status"] == "ready", (info, messages(log))
    _host_unchanged(canary)

    with sandbox_of(server, made["alias"]) as box:
        assert _root(box, "cat /opt/dest/ok.txt") == "ok"
        # The links are links, resolved in the guest: the host's files are not behind them.
        assert _root(box, "readlink /opt/dest/shadow").strip() == "/etc/shadow"
        seen = _root(box, "cat /opt/dest/shadow 2>/dev/null || true")
        assert not shadow or seen != shadow
        assert _root(box, "readlink /opt/dest/canary-link").strip() == str(canary)
        assert "keep.txt" not in _root(box, "ls /opt/dest/canary-link/ 2>&1 || true")
        assert "build-files" not in _root(box, "ls /opt/dest/root-link/ 2>&1 || true")


def test_a_file_written_through_a_symlinked_directory_never_reaches_the_host(
    server: LiveServer, raw: httpx.Client, canary: Path
) -> None:
    archive = tar_of(
        ("symlink", "evil", str(canary)),
        ("file", "evil/pwned", "evil"),
        ("symlink", "etc", "/etc"),
        ("file", "etc/e2b-pwned", "evil"),
    )
    _, info, log = _copy_build(raw, archive, "/opt/through")
    _host_unchanged(canary)
    assert not Path("/etc/e2b-pwned").exists()
    # tar, in the guest, made each link a placeholder until the end (its guard against
    # this), so the member through it has no directory to land in, and the COPY fails.
    assert info["status"] == "error", messages(log)
    assert info["reason"]["step"] == "1"
    assert info["reason"]["message"] == "tar: Exiting with failure status due to previous errors"
    assert "tar: evil/pwned: Cannot open: Not a directory" in messages(log)
    assert "tar: etc/e2b-pwned: Cannot open: Not a directory" in messages(log)


# ---------------------------------------------------------------------------- network
class Listener:
    """A TCP server on every host address that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def _host_addresses() -> list[str]:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout
    return [a for a in out.split() if ":" not in a]


PROBE = r"""
gw=$(awk '$2=="00000000"{print $3; exit}' /proc/net/route)
if [ -n "$gw" ]; then
  gw=$(printf '%d.%d.%d.%d' 0x${gw:6:2} 0x${gw:4:2} 0x${gw:2:2} 0x${gw:0:2})
fi
probe() {
  if timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; then echo "OPEN $1:$2"
  else echo "CLOSED $1:$2"; fi
}
for t in TARGETS ${gw:+$gw:API $gw:CANARY $gw:5432}; do probe "${t%:*}" "${t#*:}" & done
wait
curl -s -m 2 http://127.0.0.1:API/health && echo "CURL-OPEN" || echo "CURL-CLOSED"
"""


def test_run_steps_reach_neither_the_api_nor_the_database_nor_the_host(
    server: LiveServer, raw: httpx.Client
) -> None:
    listener = Listener()
    try:
        hosts = _host_addresses()
        for address in hosts:  # the control: the host reaches every target
            socket.create_connection((address, listener.port), timeout=2).close()
        eventually(
            lambda: listener.accepted,
            until=lambda n: n >= len(hosts),
            within=5,
            what="the control's connections counted",
        )
        reached = listener.accepted
        assert reached == len(hosts)
        targets = [f"127.0.0.1:{server.port}", "127.0.0.1:5432", f"127.0.0.1:{listener.port}"]
        targets += [f"{a}:{listener.port}" for a in hosts]
        script = (
            PROBE.replace("TARGETS", " ".join(targets))
            .replace("CANARY", str(listener.port))
            .replace("API", str(server.port))
        )
        made = request_build(raw, unique("probe"))
        spec = base_spec(run_step(script))
        assert trigger(raw, made["templateID"], made["buildID"], spec).status_code == 202
        info, log = wait_build(raw, made["templateID"], made["buildID"])
        # One more control, after the build: the listener accepts in arrival order, so a
        # step's connection would be counted before this one is.
        socket.create_connection(("127.0.0.1", listener.port), timeout=2).close()
        eventually(
            lambda: listener.accepted,
            until=lambda n: n > reached,
            within=5,
            what="the last control connection counted",
        )
        assert listener.accepted == reached + 1, "a build step connected to the host"
    finally:
        listener.close()
    text = messages(log)
    assert info["status"] == "ready", (info, text)
    said = [m.split("[stdout]: ", 1)[1] for m in text.splitlines() if "[stdout]: " in m]
    assert [m for m in said if m.startswith("OPEN") or m == "CURL-OPEN"] == [], text
    assert {f"CLOSED {t}" for t in targets} <= set(said), text
    assert "CURL-CLOSED" in said


# ---------------------------------------------------------------------------- exhaustion
def test_a_run_that_fills_the_disk_fails_the_build_and_the_host_is_fine(
    server: LiveServer, raw: httpx.Client
) -> None:
    before = shutil.disk_usage(server.sandbox_root).free
    cmd = "fallocate -l 3900M /fill1 || true; dd if=/dev/zero of=/fill2 bs=1M count=4096"
    made = request_build(raw, unique("fill"))
    assert trigger(raw, made["templateID"], made["buildID"], base_spec(run_step(cmd))).is_success
    info, log = wait_build(raw, made["templateID"], made["buildID"])
    assert info["status"] == "error"
    assert info["reason"]["message"] == f"failed to run command '{cmd}': exit status 1"
    assert info["reason"]["step"] == "1"
    assert "No space left on device" in messages(log)
    after = shutil.disk_usage(server.sandbox_root).free
    assert after > before - (256 << 20)  # the build's disk is gone with its sandbox
    assert raw.get("/health").status_code == 200


def _rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_flood_of_output_is_capped_in_the_log_and_in_memory(
    server: LiveServer, raw: httpx.Client
) -> None:
    assert server.worker is not None
    peak = _rss_peak_mb(server.worker.pid)
    # 100 000 lines of 500 bytes: 50 MB of output.
    cmd = "yes \"$(head -c 500 /dev/zero | tr '\\0' x)\" | head -n 100000"
    made = request_build(raw, unique("flood"))
    assert trigger(raw, made["templateID"], made["buildID"], base_spec(run_step(cmd))).is_success
    began = time.monotonic()
    info, log = wait_build(raw, made["templateID"], made["buildID"])
    took = time.monotonic() - began
    assert info["status"] == "ready", (took, info.get("reason", {}).get("message", "")[-80:])
    assert len(log) == LOG_CAP + 1
    assert log[-1]["message"] == f"the log is over {LOG_CAP} entries; the rest is not kept"
    assert log[-1]["level"] == "warn"
    grown = _rss_peak_mb(server.worker.pid) - peak
    print(f"FLOOD took {took:.1f} s, worker peak RSS grew {grown:.1f} MB")
    assert grown < 32


def test_a_run_that_never_ends_is_bounded_by_the_step_timeout(
    server: LiveServer, raw: httpx.Client
) -> None:
    made = request_build(raw, unique("forever"))
    spec = base_spec(run_step("echo begin; sleep 600"))
    began = time.monotonic()
    assert trigger(raw, made["templateID"], made["buildID"], spec).is_success
    running = eventually(
        lambda: {i for i in server_runtime_ids(server) if i.startswith("b-")},
        within=STEP_TIMEOUT,
        every=0.2,
        what="the build sandbox running",
    )
    info, log = wait_build(raw, made["templateID"], made["buildID"], timeout=90)
    took = time.monotonic() - began
    assert info["status"] == "error", info
    assert info["reason"]["step"] == "1"
    assert info["reason"]["message"] == (
        "failed to run command 'echo begin; sleep 600': it ran for longer than the step "
        f"limit of {STEP_TIMEOUT:g} s (TEMPLATE_STEP_TIMEOUT_SECONDS) and was stopped"
    )
    assert STEP_TIMEOUT <= took < STEP_TIMEOUT + 30, took
    # Its sandbox is gone with it.
    assert not running & server_runtime_ids(server)


def server_runtime_ids(server: LiveServer) -> set[str]:
    from e2bfacade.runtime.local import LocalRuntime

    sandboxes = server.sandbox_root / "sandboxes"
    if not sandboxes.exists():
        return set()
    return {info.sandbox_id for info in LocalRuntime(server.sandbox_root).list()}
