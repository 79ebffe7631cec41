"""Pulls from a registry on loopback: the image's config, the digest cache, the errors a
user meets (a name the registry lacks, an unreachable registry, an image over the size
limit), and credentials (right ones pull, wrong ones are refused; the password is in no
process's argv, no log and no message)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from templates.builds.registry import PullFailed, RegistryAuth, pull
from tests.templates.conftest import REGISTRY_PASSWORD, REGISTRY_USER


def test_a_pull_gives_the_flattened_root_and_the_image_config(
    registry_url: str, pull_cache: Path
) -> None:
    pulled = pull(
        "debian:bookworm", auth=None, mirror=registry_url, cache_dir=pull_cache, team_id=1
    )
    assert pulled.ref == "docker.io/library/debian:bookworm"
    assert pulled.digest.startswith("sha256:") and not pulled.cached
    assert pulled.env["PATH"].startswith("/usr/local/sbin:")
    assert pulled.cmd == ("bash",) and pulled.entrypoint == () and pulled.user == ""
    assert (pulled.rootfs / "etc/debian_version").read_text().startswith("12.")
    # Owners are kept (umoci as root): the shadow group's file, sudo setuid root.
    sudo = (pulled.rootfs / "usr/bin/sudo").stat()
    assert (sudo.st_uid, sudo.st_mode & 0o4000) == (0, 0o4000)
    assert (pulled.rootfs / "etc/shadow").stat().st_gid == 42
    assert not (pulled.rootfs / "dev").exists() or not any((pulled.rootfs / "dev").iterdir())


def test_a_second_pull_of_the_same_digest_is_only_an_inspect(
    registry_url: str, pull_cache: Path
) -> None:
    first = pull("debian:12", auth=None, mirror=registry_url, cache_dir=pull_cache, team_id=1)
    started = time.monotonic()
    again = pull(
        "docker.io/library/debian:bookworm",
        auth=None,
        mirror=registry_url,
        cache_dir=pull_cache,
        team_id=1,
    )
    took = time.monotonic() - started
    assert again.cached and again.digest == first.digest and again.rootfs == first.rootfs
    assert took < 3, took  # an uncached pull of it takes ~8 s here
    by_digest = pull(
        f"debian@{first.digest}", auth=None, mirror=registry_url, cache_dir=pull_cache, team_id=1
    )
    assert by_digest.cached and by_digest.digest == first.digest


def test_a_name_the_registry_lacks_is_a_clear_error(registry_url: str, pull_cache: Path) -> None:
    for ref in ("alpine:3.19", "debian:trixie", "ghcr.io/someone/else:1"):
        with pytest.raises(PullFailed) as caught:
            pull(ref, auth=None, mirror=registry_url, cache_dir=pull_cache, team_id=1)
        assert caught.value.message == f"image {ref!r} was not found in the registry"
    assert not [p for p in pull_cache.iterdir() if not p.name.startswith(".")]


def test_an_unreachable_registry_is_a_clear_error(pull_cache: Path) -> None:
    # A port held bound and never listened on: refused, and no other test's server can
    # take it meanwhile (a port found free and let go was once another server's).
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(PullFailed) as caught:
            pull("debian:bookworm", auth=None, mirror=nobody, cache_dir=pull_cache, team_id=1)
    assert caught.value.message == "the registry for 'debian:bookworm' is unreachable"


def test_an_image_over_the_size_limit_is_refused_before_it_is_copied(
    registry_url: str, pull_cache: Path
) -> None:
    with pytest.raises(PullFailed) as caught:
        pull(
            "e2bdev/base",
            auth=None,
            mirror=registry_url,
            cache_dir=pull_cache,
            team_id=1,
            max_mb=20,
        )
    assert "MB compressed, over this server's limit of 20 MB (TEMPLATE_IMAGE_MAX_MB)" in (
        caught.value.message
    )
    assert list(pull_cache.iterdir()) == []  # nothing was copied, not even a lock


class ArgvWatch:
    """Reads every process's argv from /proc while a pull runs: how many skopeo processes
    it saw, and whether any argv held the password."""

    def __init__(self) -> None:
        self.skopeo_pids: set[int] = set()
        self.leaks: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        deadline = time.monotonic() + 120
        while not self._stop.is_set() and time.monotonic() < deadline:
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                try:
                    argv = Path(f"/proc/{name}/cmdline").read_bytes()
                except OSError:
                    continue
                if argv.startswith(b"skopeo\0"):
                    self.skopeo_pids.add(int(name))
                if REGISTRY_PASSWORD.encode() in argv:
                    self.leaks.append(argv.decode(errors="replace"))
            time.sleep(0.02)


def test_right_credentials_pull_and_the_password_shows_nowhere(
    private_registry_url: str, pull_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    auth = RegistryAuth(REGISTRY_USER, REGISTRY_PASSWORD)
    with ArgvWatch() as watch:
        pulled = pull(
            "debian:bookworm",
            auth=auth,
            mirror=private_registry_url,
            cache_dir=pull_cache,
            team_id=1,
        )
    assert pulled.digest.startswith("sha256:")
    assert watch.skopeo_pids, "the watch saw no skopeo process: it checked nothing"
    assert watch.leaks == []
    assert REGISTRY_PASSWORD not in caplog.text
    assert not [p for p in Path("/tmp").glob("e2bfacade-auth-*")]  # the auth file is gone
    for path in pull_cache.rglob("*.json"):
        assert REGISTRY_PASSWORD not in path.read_text(errors="replace")


def test_wrong_or_missing_credentials_are_a_clear_error(
    private_registry_url: str, pull_cache: Path
) -> None:
    wrong = RegistryAuth(REGISTRY_USER, "not-" + REGISTRY_PASSWORD)
    with pytest.raises(PullFailed) as caught:
        pull(
            "debian:bookworm",
            auth=wrong,
            mirror=private_registry_url,
            cache_dir=pull_cache,
            team_id=1,
        )
    assert (
        caught.value.message == "the registry refused the credentials given for 'debian:bookworm'"
    )
    with pytest.raises(PullFailed) as caught:
        pull(
            "debian:bookworm",
            auth=None,
            mirror=private_registry_url,
            cache_dir=pull_cache,
            team_id=1,
        )
    assert caught.value.message == (
        "the registry requires credentials to pull 'debian:bookworm' (fromImageRegistry)"
    )
