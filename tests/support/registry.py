"""A container registry on loopback for the template tests and benchmarks: Debian's
``docker-registry serve`` on 127.0.0.1 and a free port, its storage in a directory of the
caller's, optionally with htpasswd authentication, seeded with this service's Debian bases
(templates/builds/debian.py, from the cache: nothing is downloaded unless asked).

No pytest here: ``bench/`` uses it too. The tests' fixtures are in tests/templates/conftest.py.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.live_process import free_port
from tests.support.waiting import eventually

START_SECONDS = 10.0


class RegistryError(RuntimeError):
    pass


def htpasswd_line(username: str, password: str) -> str:
    """An htpasswd entry the registry accepts (bcrypt, ``$2b$``)."""
    # crypt is deprecated (gone in 3.13) but in 3.11; libxcrypt makes bcrypt hashes.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt as _crypt

        # The lowest cost (2^4): the registry checks the hash on every request of a pull.
        hashed = _crypt.crypt(password, _crypt.mksalt(_crypt.METHOD_BLOWFISH, rounds=16))
    if not hashed or not hashed.startswith("$2"):
        raise RegistryError(
            "this libcrypt makes no bcrypt hash (the registry's htpasswd needs one)"
        )
    return f"{username}:{hashed}\n"


@contextmanager
def loopback_registry(storage: Path, *, users: dict[str, str] | None = None) -> Iterator[str]:
    """Serve a registry with its blobs in ``storage`` on 127.0.0.1; yields its URL
    (``http://127.0.0.1:<port>``) and stops it on exit (no process is left). ``users``:
    username → password, required of every request (htpasswd)."""
    if shutil.which("docker-registry") is None:
        raise RegistryError("docker-registry is not installed (scripts/setup.sh installs it)")
    storage.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage / "data")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": secrets.token_hex(16)},
    }
    if users:
        htpasswd = storage / "htpasswd"
        htpasswd.write_text("".join(htpasswd_line(u, p) for u, p in users.items()))
        config["auth"] = {"htpasswd": {"realm": "e2bfacade-test", "path": str(htpasswd)}}
    (storage / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    log = open(storage / "registry.log", "ab")  # noqa: SIM115 - the child's
    process = subprocess.Popen(
        ["docker-registry", "serve", str(storage / "config.yml")],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(storage)},
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, storage)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def _wait_ready(url: str, process: subprocess.Popen[bytes], storage: Path) -> None:
    def answering() -> bool:
        if process.poll() is not None:
            raise RegistryError(
                f"docker-registry exited: {(storage / 'registry.log').read_text()[-2000:]}"
            )
        return httpx.get(f"{url}/v2/", timeout=1, trust_env=False).status_code in (200, 401)

    try:
        eventually(
            answering,
            within=START_SECONDS,
            what=f"docker-registry answering on {url}",
            ignoring=(httpx.TransportError,),
        )
    except AssertionError as exc:
        raise RegistryError(str(exc)) from None
