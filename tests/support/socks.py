"""A SOCKS5 server on the suite's test internet: Debian's ``dante-server`` (``danted``),
run inside the test internet's network namespace on an address of its own, with RFC 1929
username/password authentication or none.

Dante checks usernames against the system's password database; so that the suite adds no
account to this machine, danted runs in a mount namespace of its own where ``/etc/passwd``
and ``/etc/shadow`` are files of this helper holding one test user (and where
``/etc/resolv.conf`` names the test internet's resolver, and ``/etc/hosts`` has a name no
DNS server knows, ``ONLY_HERE``: a client reaches it only by sending the name, remote DNS).
Its log (``log_text()``) names each client and destination.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.support.internet import TestInternet
from tests.support.waiting import eventually


def _hash(password: str) -> str:
    """sha512-crypt, as /etc/shadow holds it."""
    done = subprocess.run(
        ["openssl", "passwd", "-6", "-stdin"],
        input=password, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return done.stdout.strip()


# (name, address): resolved by the SOCKS server's own /etc/hosts, by no DNS server.
ONLY_HERE = ("socks-only.example", "203.0.113.10")


class Dante:
    """``with Dante(internet, "203.0.113.40", user=..., password=...) as socks:`` — a SOCKS5
    server at ``socks.address``:1080 on the test internet (no credentials: none demanded)."""

    port = 1080

    def __init__(
        self,
        internet: TestInternet,
        address: str,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        if shutil.which("danted") is None:
            raise RuntimeError("danted is not installed (scripts/setup.sh installs dante-server)")
        self.internet, self.address = internet, address
        self.user, self.password = user, password
        self.dir = Path(tempfile.mkdtemp(prefix="e2bt-socks-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.dir / "danted.log"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def __enter__(self) -> Dante:
        ns = self.internet.name
        subprocess.run(
            ["ip", "-n", ns, "addr", "add", f"{self.address}/32", "dev", "lo"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        method = "username" if self.user else "none"
        (self.dir / "danted.conf").write_text(
            f"logoutput: {self.log}\n"
            f"internal: {self.address} port = {self.port}\n"
            f"external: {self.address}\n"
            f"socksmethod: {method}\n"
            "clientmethod: none\n"
            "user.privileged: root\n"
            "user.unprivileged: root\n"
            "client pass {\n  from: 0.0.0.0/0 to: 0.0.0.0/0\n  log: connect error\n}\n"
            "socks pass {\n  from: 0.0.0.0/0 to: 0.0.0.0/0\n"
            "  log: connect disconnect error\n}\n"
        )
        (self.dir / "resolv.conf").write_text("nameserver 8.8.8.8\n")
        # A name only this server resolves: a client that resolved it first would fail.
        (self.dir / "hosts").write_text(f"127.0.0.1 localhost\n{ONLY_HERE[1]} {ONLY_HERE[0]}\n")
        passwd = Path("/etc/passwd").read_text()
        shadow = Path("/etc/shadow").read_text()
        if self.user:
            passwd += f"{self.user}:x:64999:64999::/nonexistent:/usr/sbin/nologin\n"
            shadow += f"{self.user}:{_hash(self.password or '')}:19000:0:99999:7:::\n"
        (self.dir / "passwd").write_text(passwd)
        (self.dir / "shadow").write_text(shadow)
        (self.dir / "shadow").chmod(0o600)
        script = (
            f"mount --bind {self.dir}/passwd /etc/passwd && "
            f"mount --bind {self.dir}/shadow /etc/shadow && "
            f"mount --bind {self.dir}/resolv.conf /etc/resolv.conf && "
            f"mount --bind {self.dir}/hosts /etc/hosts && "
            f"exec danted -f {self.dir}/danted.conf -p {self.dir}/danted.pid"
        )
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", ns, "unshare", "-m", "--propagation", "private",
             "sh", "-c", script],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr.log", "wb"),  # noqa: SIM115
            start_new_session=True,  # danted's children go with it (killpg below)
        )  # fmt: skip
        process = self.process

        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError("it exited")
            probe = subprocess.run(
                ["ip", "netns", "exec", ns, "ss", "-Hltn", f"src {self.address}:{self.port}"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            return bool(probe.stdout.strip())

        try:
            eventually(listening, within=20, what="danted listening")
        except (AssertionError, RuntimeError) as exc:
            err = (self.dir / "stderr.log").read_text(errors="replace") + self.log_text()
            self.__exit__()
            raise RuntimeError(f"danted did not start ({exc}): {err[-2000:]}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        subprocess.run(
            ["ip", "-n", self.internet.name, "addr", "del", f"{self.address}/32", "dev", "lo"],
            capture_output=True, timeout=30,
        )  # fmt: skip
        if os.environ.get("E2BT_KEEP_SOCKS") is None:
            shutil.rmtree(self.dir, ignore_errors=True)
