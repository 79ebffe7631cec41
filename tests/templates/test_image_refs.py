"""How a ``fromImage`` is normalised and where the mirror sends it; what a
``fromImageRegistry`` becomes. No registry needed."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from templates.builds.registry import ImageRef, PullFailed, RegistryAuth, authfile, parse_ref

DIGEST = "sha256:" + "ab" * 32
MIRROR = "http://127.0.0.1:5055"


@pytest.mark.parametrize(
    ("ref", "registry", "repository", "tag", "digest"),
    [
        ("debian:bookworm", "docker.io", "library/debian", "bookworm", None),
        ("debian", "docker.io", "library/debian", "latest", None),
        ("python:3.11", "docker.io", "library/python", "3.11", None),
        ("e2bdev/base", "docker.io", "e2bdev/base", "latest", None),
        ("docker.io/library/x", "docker.io", "library/x", "latest", None),
        ("docker.io/x", "docker.io", "library/x", "latest", None),
        ("index.docker.io/org/x:1", "docker.io", "org/x", "1", None),
        ("ghcr.io/org/img:tag", "ghcr.io", "org/img", "tag", None),
        ("ghcr.io/org/team/img", "ghcr.io", "org/team/img", "latest", None),
        ("localhost/img", "localhost", "img", "latest", None),
        ("localhost:5000/a/b:c", "localhost:5000", "a/b", "c", None),
        (f"ubuntu@{DIGEST}", "docker.io", "library/ubuntu", "latest", DIGEST),
        (f"quay.io/x/y:1.2@{DIGEST}", "quay.io", "x/y", "1.2", DIGEST),
    ],
)
def test_references_are_normalised_as_docker_does(
    ref: str, registry: str, repository: str, tag: str, digest: str | None
) -> None:
    assert parse_ref(ref) == ImageRef(registry, repository, tag, digest)


@pytest.mark.parametrize(
    "ref",
    [
        "",
        " ",
        "Debian",
        "debian:",
        "debian:bad tag",
        "a//b",
        "x@sha256:zz",
        "-x",
        "x:-y",
        "a" * 600,
    ],
)
def test_a_malformed_reference_is_refused_with_its_name(ref: str) -> None:
    with pytest.raises(PullFailed) as caught:
        parse_ref(ref)
    assert caught.value.message.startswith(repr(ref))


@pytest.mark.parametrize(
    ("ref", "source"),
    [
        ("debian:bookworm", "127.0.0.1:5055/library/debian:bookworm"),
        ("e2bdev/base", "127.0.0.1:5055/e2bdev/base:latest"),
        ("docker.io/library/python:3.11", "127.0.0.1:5055/library/python:3.11"),
        ("ghcr.io/org/img:1", "127.0.0.1:5055/ghcr.io/org/img:1"),
        ("localhost:5000/x", "127.0.0.1:5055/localhost-5000/x:latest"),
        (f"debian@{DIGEST}", f"127.0.0.1:5055/library/debian@{DIGEST}"),
    ],
)
def test_with_a_mirror_every_image_is_pulled_from_it(ref: str, source: str) -> None:
    assert parse_ref(ref).source(MIRROR) == source


def test_without_a_mirror_an_image_comes_from_its_own_registry() -> None:
    assert parse_ref("debian").source(None) == "docker.io/library/debian:latest"
    assert parse_ref("ghcr.io/o/i:2").source(None) == "ghcr.io/o/i:2"


@pytest.mark.parametrize("kind", ["aws", "gcp"])
def test_cloud_registry_credentials_are_refused_as_unsupported(kind: str) -> None:
    wire = {"type": kind, "awsAccessKeyId": "AKIDSECRET", "serviceAccountJson": "{}"}
    with pytest.raises(PullFailed) as caught:
        RegistryAuth.from_wire(wire)
    assert f"type {kind!r} are not supported" in caught.value.message
    assert "AKIDSECRET" not in caught.value.message


def test_registry_credentials_need_a_username_and_password_and_never_show_it() -> None:
    auth = RegistryAuth.from_wire({"type": "registry", "username": "u", "password": "pw-123"})
    assert auth == RegistryAuth("u", "pw-123")
    assert "pw-123" not in repr(auth)
    assert RegistryAuth.from_wire(None) is None
    with pytest.raises(PullFailed, match="needs a username and a password"):
        RegistryAuth.from_wire({"type": "registry", "username": "u"})
    with pytest.raises(PullFailed, match="unknown"):
        RegistryAuth.from_wire({"type": "azure"})


def test_the_auth_file_is_private_and_removed_after_use() -> None:
    with authfile("127.0.0.1:5055", RegistryAuth("u", "pw")) as args:
        assert args[0] == "--authfile"
        path = Path(args[1])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert json.loads(path.read_text()) == {"auths": {"127.0.0.1:5055": {"auth": "dTpwdw=="}}}
    assert not path.exists() and not path.parent.exists()
    with authfile("h", None) as none:
        assert none == []
    assert os.path.exists("/tmp")
