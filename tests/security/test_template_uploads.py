"""COPY archive uploads against a real ``manage.py serve``, its front (nginx) in the path as
in production: what an upload URL's holder, or anyone without one, can make the host store.

- a forged signature is answered 403 while the client is still sending, and no byte of
  the body lands on disk (neither in the front's temporary files nor in the team's files);
- a sender that trickles its body, or that sends steadily but for too long, is cut and
  leaves nothing, and what it had reserved of its team's quota is given back;
- an upload URL is used once: a replay, even a concurrent one, is refused 403;
- concurrent uploads of one team never store more than the team's quota, and the service
  holds at most its global number and bytes of uploads in flight.

One serve for the module, on its own deployment, with small bounds so that they are met
quickly (see ``BOUNDS``)."""

from __future__ import annotations

import glob
import json
import os
import select
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from e2b.api.client.client import AuthenticatedClient
from e2b.template_sync.build_api import upload_file

from tests.contract.template_support import file_link, files_hash, request_build, unique
from tests.faults.test_supervision import Serve
from tests.support.live_server import Deployment, TeamKey, suite_database_url

MiB = 1 << 20
IDLE_SECONDS = 3  # DATAPLANE_BODY_IDLE_SECONDS: 64 KiB must move in this
TOTAL_SECONDS = 10  # TEMPLATE_UPLOAD_SECONDS: a whole upload's deadline
QUOTA_MB = 10  # TEMPLATE_FILES_MAX_MB_PER_TEAM
BOUNDS = {
    "DATAPLANE_BODY_IDLE_SECONDS": str(IDLE_SECONDS),
    "TEMPLATE_UPLOAD_SECONDS": str(TOTAL_SECONDS),
    "TEMPLATE_FILES_MAX_MB_PER_TEAM": str(QUOTA_MB),
    "TEMPLATE_UPLOADS_PER_TEAM": "3",
    "TEMPLATE_UPLOADS_IN_FLIGHT": "5",
    "TEMPLATE_UPLOADS_IN_FLIGHT_MB": "20",
}
SLACK_SECONDS = 6.0  # over a cut's deadline, on a loaded 2-core machine


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    with Deployment(
        teams=8, prefix="e2bupl", suite_url=suite_database_url(), extra_env=BOUNDS
    ) as made:
        yield made


@pytest.fixture(scope="module")
def service(deployment: Deployment) -> Iterator[Serve]:
    serve = Serve(deployment)
    try:
        yield serve.running()
    finally:
        serve.stop()
        serve.kill_leftovers()


class Team:
    """A fresh team of the deployment, with a template to ask upload links for."""

    def __init__(self, service: Serve, key: TeamKey) -> None:
        self.service, self.key = service, key
        self.http = httpx.Client(
            base_url=service.url, headers={"X-API-Key": key.api_key}, timeout=30
        )
        self.template_id = str(request_build(self.http, unique("uploads"))["templateID"])

    def link(self) -> tuple[str, str]:
        """A new archive's files hash and its upload URL."""
        digest = files_hash(os.urandom(16))
        got = file_link(self.http, self.template_id, digest)
        assert got["present"] is False
        return digest, str(got["url"])

    @property
    def files(self) -> Path:
        return self.service.deployment.sandbox_root / "build-files" / str(self.key.team_id)

    def stored(self) -> dict[str, int]:
        """The team's files on disk (archives and partial uploads alike), with their sizes."""
        if not self.files.exists():
            return {}
        return {p.name: p.stat().st_size for p in self.files.iterdir()}


@pytest.fixture
def team(service: Serve, deployment: Deployment) -> Iterator[Team]:
    made = Team(service, deployment.take_team())
    try:
        yield made
    finally:
        made.http.close()


def front_spool(service: Serve) -> list[str]:
    """Every file nginx's front keeps for requests (its client body and proxy temporary
    files): none may hold an upload's body."""
    assert service.process is not None
    pattern = os.path.join(tempfile.gettempdir(), f"e2bfacade-front-{service.process.pid}-*")
    (directory,) = glob.glob(pattern)
    found = []
    for sub in ("client_body", "proxy"):
        for root, _, names in os.walk(os.path.join(directory, sub)):
            found += [os.path.join(root, n) for n in names]
    return found


class Put:
    """A PUT on a raw socket, its body sent by the test piece by piece."""

    def __init__(self, service: Serve, url: str, length: int) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection(("127.0.0.1", service.port), timeout=30)
        head = (
            f"PUT {parts.path}?{parts.query} HTTP/1.1\r\nHost: 127.0.0.1:{service.port}\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
        )
        self.sock.sendall(head.encode())
        self.length, self.sent = length, 0
        self.answer = b""

    def answered(self, timeout: float = 0) -> bool:
        """Whether the server has answered (or closed), waiting up to ``timeout``."""
        if self.answer:
            return True
        readable, _, _ = select.select([self.sock], [], [], timeout)
        if readable:
            try:
                self.answer = self.sock.recv(65536) or b"<closed>"
            except ConnectionResetError:
                self.answer = b"<reset>"
        return bool(self.answer)

    def send(self, size: int) -> bool:
        """Send ``size`` more body bytes; False when the server has stopped taking them."""
        try:
            self.sock.sendall(b"x" * min(size, self.length - self.sent))
        except (BrokenPipeError, ConnectionResetError):
            return False
        self.sent += size
        return True

    def finish(self) -> tuple[int, dict[str, object]]:
        """Send the rest of the body; the status and JSON body answered."""
        while self.sent < self.length and not self.answered() and self.send(MiB):
            pass
        deadline = time.monotonic() + 30
        while b"\r\n\r\n" not in self.answer or not self.answer.endswith(b"}"):
            assert self.answered(max(deadline - time.monotonic(), 0)), "no answer"
            try:
                more = self.sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                more = b""
            if not more:
                break
            self.answer += more
        self.sock.close()
        return status_of(self.answer)


def status_of(answer: bytes) -> tuple[int, dict[str, object]]:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body.startswith(b"{") else {}


def test_a_forged_signature_is_refused_while_the_body_is_still_being_sent(
    service: Serve, team: Team
) -> None:
    digest, url = team.link()
    forged = url.replace("signature=", "signature=0" if "signature=1" in url else "signature=1")
    put = Put(service, forged, 512 * MiB)
    spooled: list[str] = []
    while put.sent < 64 * MiB and not put.answered() and put.send(MiB):
        if put.sent == 8 * MiB:
            spooled = front_spool(service)
    put.answered(SLACK_SECONDS)
    status, body = put.finish()
    # Answered after at most the first few MiB of 512: the body was never waited for.
    assert status == 403, (put.answer[:300], put.sent)
    assert "signature" in str(body["message"])
    assert put.sent < 64 * MiB
    assert spooled == [] and front_spool(service) == []
    assert team.stored() == {}


def test_a_trickling_sender_is_cut_and_leaves_nothing(service: Serve, team: Team) -> None:
    _, url = team.link()
    put = Put(service, url, MiB)
    began = time.monotonic()
    spooled: list[str] = []
    # A byte every half second: well within nginx's read timeout, far below 64 KiB in
    # IDLE_SECONDS.
    while time.monotonic() - began < IDLE_SECONDS + SLACK_SECONDS and not put.answered(0.5):
        put.send(1)
        if put.sent == 4:
            spooled = front_spool(service)
    status, body = put.finish()
    assert status == 408, body
    assert time.monotonic() - began < IDLE_SECONDS + SLACK_SECONDS
    assert spooled == [] and front_spool(service) == []
    assert team.stored() == {}
    # What it had reserved is the team's again: an archive of the whole quota fits.
    _, whole = team.link()
    assert httpx.put(whole, content=b"q" * (QUOTA_MB * MiB), timeout=60).status_code == 200


def test_a_steady_sender_past_the_upload_deadline_is_cut_and_leaves_nothing(
    service: Serve, team: Team
) -> None:
    _, url = team.link()
    put = Put(service, url, 8 * MiB)  # 64 s at the rate below
    began = time.monotonic()
    while time.monotonic() - began < TOTAL_SECONDS + SLACK_SECONDS and not put.answered(0.5):
        put.send(64 << 10)
    status, body = put.finish()
    assert status == 408, body
    assert TOTAL_SECONDS - 1 < time.monotonic() - began < TOTAL_SECONDS + SLACK_SECONDS
    assert front_spool(service) == []
    assert team.stored() == {}


def test_the_sdks_own_upload_through_the_front_stores_the_archive(
    team: Team, tmp_path: Path
) -> None:
    (tmp_path / "app.py").write_text("print('hello')\n")
    digest, url = team.link()
    client = AuthenticatedClient(base_url=team.service.url, token=team.key.api_key)
    upload_file(client, "app.py", str(tmp_path), url, [], False, False, None)
    with tarfile.open(team.files / f"{digest}.tar") as archive:
        assert archive.getnames() == ["app.py"]
    assert file_link(team.http, team.template_id, digest)["present"] is True


def test_a_replayed_upload_url_is_refused(team: Team) -> None:
    digest, url = team.link()
    assert httpx.put(url, content=b"first", timeout=30).status_code == 200
    replay = httpx.put(url, content=b"second", timeout=30)
    assert replay.status_code == 403, replay.text
    assert "already been used" in replay.json()["message"]
    assert (team.files / f"{digest}.tar").read_bytes() == b"first"


def test_a_url_replayed_concurrently_stores_one_body(team: Team) -> None:
    digest, url = team.link()
    bodies = [bytes([65 + n]) * MiB for n in range(5)]
    statuses: dict[bytes, int] = {}

    def put(body: bytes) -> None:
        statuses[body] = httpx.put(url, content=body, timeout=60).status_code

    threads = [threading.Thread(target=put, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert sorted(statuses.values()) == [200, 403, 403, 403, 403]
    (winner,) = [b for b, s in statuses.items() if s == 200]
    assert (team.files / f"{digest}.tar").read_bytes() == winner
    assert list(team.stored()) == [f"{digest}.tar"]


def test_concurrent_uploads_of_one_team_never_store_more_than_its_quota(team: Team) -> None:
    links = [team.link()[1] for _ in range(8)]
    statuses: list[int] = []

    def put(url: str) -> None:
        statuses.append(httpx.put(url, content=b"z" * (3 * MiB), timeout=60).status_code)

    threads = [threading.Thread(target=put, args=(u,)) for u in links]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    # 3 MiB each under 10 MiB: three fit, whoever comes first.
    assert sorted(statuses) == [200] * 3 + [413] * 5, (statuses, team.stored())
    assert sorted(team.stored().values()) == [3 * MiB] * 3


class Held:
    """An upload kept in flight: part of its body sent, more fed slowly (within the idle
    bound) until :meth:`finish`."""

    def __init__(self, service: Serve, url: str, length: int) -> None:
        self.put = Put(service, url, length)
        self.put.send(MiB)
        self.stop = threading.Event()
        self.feeder = threading.Thread(target=self._feed, daemon=True)
        self.feeder.start()

    def _feed(self) -> None:
        while not self.stop.wait(0.5) and self.put.sent < self.put.length - (128 << 10):
            self.put.send(64 << 10)

    def finish(self) -> int:
        self.stop.set()
        self.feeder.join()
        return self.put.finish()[0]


def test_uploads_in_flight_are_bounded_per_team_and_for_the_service(
    service: Serve, deployment: Deployment
) -> None:
    a, b, c = (Team(service, deployment.take_team()) for _ in range(3))
    held_a = [Held(service, a.link()[1], 3 * MiB) for _ in range(3)]
    held_b = [Held(service, b.link()[1], 3 * MiB) for _ in range(2)]
    try:
        time.sleep(0.5)  # every held upload has reserved its bytes
        # Team A has its three uploads in flight (TEMPLATE_UPLOADS_PER_TEAM).
        r = httpx.put(a.link()[1], content=b"a" * 1024, timeout=30)
        assert r.status_code == 429, r.text
        # Five in flight in all (TEMPLATE_UPLOADS_IN_FLIGHT): team C, with nothing of its
        # own in flight, waits too.
        r = httpx.put(c.link()[1], content=b"c" * 1024, timeout=30)
        assert r.status_code == 503, r.text
        assert r.headers.get("retry-after")
        assert held_b.pop().finish() == 200
        # Four in flight, 12 MiB: 9 more would pass TEMPLATE_UPLOADS_IN_FLIGHT_MB (20).
        r = httpx.put(c.link()[1], content=b"c" * (9 * MiB), timeout=30)
        assert r.status_code == 503, r.text
        r = httpx.put(c.link()[1], content=b"c" * (8 * MiB), timeout=30)
        assert r.status_code == 200, r.text
    finally:
        finished = [h.finish() for h in held_a + held_b]
        for made in (a, b, c):
            made.http.close()
    assert finished == [200] * 4
