"""The front's map in a real HAProxy (Debian's): replaced atomically, updated entry by entry
at run time, and written to its file, which a reload of HAProxy reads."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from e2bfacade.fleet.haproxy import Front, FrontError
from tests.support.live_process import free_port
from tests.support.waiting import eventually


def backend(name: str) -> ThreadingHTTPServer:
    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = name.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[Front, str, subprocess.Popen[bytes]]]:
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed: scripts/setup.sh --tests installs it")
    hosts = {name: backend(name) for name in ("hosta", "hostb")}
    port = free_port()
    sock, map_file = tmp_path / "admin.sock", tmp_path / "sandboxes.map"
    map_file.touch()
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        f"global\n    stats socket {sock} mode 600 level admin\n"
        "defaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n"
        "    timeout server 5s\n"
        f"frontend api\n    bind 127.0.0.1:{port}\n"
        "    http-request set-var(txn.sid) path,field(3,/)\n"
        f"    use_backend %[var(txn.sid),map({map_file})] if "
        f"{{ var(txn.sid),map({map_file}) -m found }}\n"
        "    default_backend nowhere\n"
        "backend nowhere\n"
        "    http-request return status 404 content-type text/plain string nowhere\n"
        + "".join(
            f"backend {name}\n    server s 127.0.0.1:{server.server_address[1]}\n"
            for name, server in hosts.items()
        )
    )
    proc = subprocess.Popen(["haproxy", "-W", "-f", str(config)])
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(sock.exists, within=10, what="HAProxy's admin socket")
        yield Front(sock, map_file), url, proc
    finally:
        proc.terminate()
        proc.wait()
        for server in hosts.values():
            server.shutdown()


def routed(url: str, sandbox_id: str) -> str:
    return httpx.get(f"{url}/sandboxes/{sandbox_id}/x", timeout=5).text


def test_the_map_routes_each_sandbox_to_its_host_and_follows_every_change(
    front: tuple[Front, str, subprocess.Popen[bytes]],
) -> None:
    map_front, url, _ = front
    map_front.replace({"s1": "hosta", "s2": "hostb"})
    assert (routed(url, "s1"), routed(url, "s2"), routed(url, "s3")) == (
        "hosta",
        "hostb",
        "nowhere",
    )
    map_front.update({"s1": "hostb", "s3": "hosta"}, ["s2", "never-there"])
    assert (routed(url, "s1"), routed(url, "s2"), routed(url, "s3")) == (
        "hostb",
        "nowhere",
        "hosta",
    )
    assert map_front.entries() == {"s1": "hostb", "s3": "hosta"}


def test_a_reload_reads_the_map_file_the_syncer_keeps(
    front: tuple[Front, str, subprocess.Popen[bytes]],
) -> None:
    map_front, url, proc = front
    map_front.replace({"s1": "hosta"})
    map_front.update({"s2": "hostb"}, [])
    map_front.write_file({"s1": "hosta", "s2": "hostb"})
    proc.send_signal(signal.SIGUSR2)  # master-worker mode: reload the configuration
    eventually(
        lambda: routed(url, "s2"),
        within=10,
        what="the reloaded front to route by the file",
        until=lambda host: host == "hostb",
        ignoring=(httpx.TransportError,),
    )
    assert routed(url, "s1") == "hosta"


def test_a_key_that_could_split_a_command_is_refused(
    front: tuple[Front, str, subprocess.Popen[bytes]],
) -> None:
    map_front, _, _ = front
    for bad in ("a b", "a;show", "a\nb", "#x", ""):
        with pytest.raises(ValueError):
            map_front.replace({bad: "hosta"})
    with pytest.raises(FrontError):
        Front(map_front.socket_path, Path("/no/such.map")).replace({"s1": "hosta"})
