"""The Debian images this service provides for E2B's base names, and their push to a
registry (``manage.py seed_registry``).

An image is made in three steps, each cached under ``cache_dir`` by the digest of its
recipe (what is asked of mmdebstrap), so that rebuilding a registry on the same machine
takes seconds:

1. ``mmdebstrap --variant=minbase --skip=output/dev --include=<packages> <suite>`` writes a
   root file system tarball, ``<digest>.tar``. This is the only step that needs the network,
   and only Debian's mirror. ``/dev`` is left out: a sandbox gets the runtime's, and the
   runtime refuses device nodes in an image. Documentation, man pages and locales are left
   out too (as in Docker's ``-slim`` images): a build that needs them installs them.
2. umoci packs it as a one-layer OCI image, ``<digest>.oci`` (``Env`` PATH, ``Cmd`` bash).
3. skopeo copies that image into the registry under each of the recipe's names.

The images are built from Debian's archive of the day they are built, not from Docker
Hub's: ``debian:bookworm`` here is Debian bookworm with the runtime's packages, not
Docker's image of it. ``--ubuntu-substitute`` pushes the Debian image under
``library/ubuntu:22.04`` too, for test suites that hard-code that name; it is logged as a
substitution, since nothing of it is Ubuntu.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from templates.builds.registry import (
    CLEAN_ENV,
    PullFailed,
    RegistryAuth,
    architecture,
    authfile,
    registry_host,
)

# Bumped when what a recipe makes changes beyond its fields (the hooks, the packing).
RECIPE_VERSION = 1
DEFAULT_CACHE_DIR = Path("/var/cache/e2bfacade/bases")
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Bounds: a cold mmdebstrap of the bigger recipe took about a minute here; a slow mirror
# may take several. A push of a cached image takes about a second.
MMDEBSTRAP_TIMEOUT = 1800.0
PACK_TIMEOUT = 600.0
PUSH_TIMEOUT = 600.0

# What the runtime and the build steps need in every base: accounts and sudo (the default
# user's phase), tar and gzip (COPY's archives), iproute2, procps and curl (the ready
# helpers: ss, ps, an HTTP probe), CA certificates (HTTPS from a build step). bash and
# coreutils are in minbase already (Essential).
RUNTIME_PACKAGES = (
    "sudo",
    "passwd",
    "iproute2",
    "procps",
    "curl",
    "ca-certificates",
    "tar",
    "gzip",
)
# E2B's base image (``e2bdev/base``, the SDK's default) approximated with Debian's packages.
E2B_BASE_PACKAGES = (
    *RUNTIME_PACKAGES,
    "bash",
    "coreutils",
    "git",
    "python3",
    "python3-pip",
    "python3-venv",
    "python-is-python3",
    "less",
    "jq",
)
SLIM_DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/info/*",
)


class BaseBuildFailed(Exception):
    """A base image could not be made or pushed; ``message`` says why, in the tool's words."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BaseNotCached(BaseBuildFailed):
    """The recipe's tarball is not in the cache and building it was not allowed (offline)."""


@dataclass(frozen=True)
class Recipe:
    name: str
    suite: str
    packages: tuple[str, ...]
    # Where it is pushed, as repository:tag paths of the registry.
    names: tuple[str, ...]
    mirror: str | None = None  # None: mmdebstrap's default (deb.debian.org, with security)

    def digest(self) -> str:
        fields = {
            "version": RECIPE_VERSION,
            "suite": self.suite,
            "variant": "minbase",
            "packages": sorted(self.packages),
            "dpkg": SLIM_DPKG_OPTIONS,
            "mirror": self.mirror,
            "arch": architecture(),
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


DEBIAN_BOOKWORM = Recipe(
    name="debian-bookworm",
    suite="bookworm",
    packages=RUNTIME_PACKAGES,
    names=("library/debian:bookworm", "library/debian:12"),
)
E2B_BASE = Recipe(
    name="e2b-base",
    suite="bookworm",
    packages=E2B_BASE_PACKAGES,
    names=("e2bdev/base:latest",),
)
RECIPES = (DEBIAN_BOOKWORM, E2B_BASE)
# Pushed only when asked for (--ubuntu-substitute): the Debian image under Ubuntu's name.
UBUNTU_SUBSTITUTE = "library/ubuntu:22.04"


@dataclass(frozen=True)
class Seeded:
    name: str  # repository:tag in the registry
    recipe: str
    digest: str  # the recipe's digest
    seconds: float
    substitute: bool = False


Log = Callable[[str], None]


def _no_log(_line: str) -> None:
    pass


def seed(
    registry: str,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    recipes: tuple[Recipe, ...] = RECIPES,
    ubuntu_substitute: bool = False,
    offline: bool = False,
    auth: RegistryAuth | None = None,
    log: Log = _no_log,
) -> list[Seeded]:
    """Build (or take from the cache) every recipe's image and push it to ``registry``
    (``http://host:port``: plain HTTP; ``https://``: verified TLS) under its names.
    ``offline``: never run mmdebstrap; a recipe not in the cache raises BaseNotCached."""
    done: list[Seeded] = []
    for recipe in recipes:
        started = time.monotonic()
        layout = oci_layout(recipe, cache_dir=cache_dir, offline=offline, log=log)
        names = list(recipe.names)
        if ubuntu_substitute and recipe is DEBIAN_BOOKWORM:
            names.append(UBUNTU_SUBSTITUTE)
        for name in names:
            substitute = name == UBUNTU_SUBSTITUTE
            if substitute:
                log(
                    f"SUBSTITUTION: {name} is pushed as Debian {recipe.suite} "
                    f"(recipe {recipe.name}); nothing of it is Ubuntu"
                )
            push(layout, registry, name, auth=auth)
            log(f"pushed {name} ({recipe.name}, recipe {recipe.digest()})")
            done.append(
                Seeded(name, recipe.name, recipe.digest(), time.monotonic() - started, substitute)
            )
            started = time.monotonic()
    return done


def rootfs_tarball(
    recipe: Recipe,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    offline: bool = False,
    log: Log = _no_log,
) -> Path:
    """The recipe's mmdebstrap tarball, made once and kept in ``cache_dir``."""
    target = cache_dir / f"{recipe.digest()}.tar"
    if target.exists():
        return target
    if offline:
        raise BaseNotCached(
            f"the {recipe.name} base ({recipe.digest()}) is not cached in {cache_dir}: build it "
            f"once with network access to Debian's mirror: manage.py seed_registry --build-only"
        )
    with _locked(cache_dir, recipe.digest()):
        if target.exists():
            return target
        if shutil.which("mmdebstrap") is None:
            raise BaseBuildFailed("mmdebstrap is not installed (scripts/setup.sh installs it)")
        log(f"mmdebstrap {recipe.suite} for {recipe.name}: this downloads from Debian's mirror")
        tmp = cache_dir / f".{recipe.digest()}.{os.getpid()}.tar"
        argv = [
            "mmdebstrap",
            "--variant=minbase",
            "--skip=output/dev",
            "--format=tar",
            "--quiet",
            *(f"--dpkgopt={option}" for option in SLIM_DPKG_OPTIONS),
            f"--include={','.join(recipe.packages)}",
            recipe.suite,
            str(tmp),
        ]
        if recipe.mirror:
            argv.append(recipe.mirror)
        started = time.monotonic()
        try:
            _run(argv, timeout=MMDEBSTRAP_TIMEOUT, what=f"mmdebstrap for {recipe.name}")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        log(f"mmdebstrap {recipe.name}: {time.monotonic() - started:.1f} s")
    return target


def oci_layout(
    recipe: Recipe,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    offline: bool = False,
    log: Log = _no_log,
) -> Path:
    """The recipe's image as an OCI layout (tag ``img``), packed once and kept."""
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = cache_dir / f"{recipe.digest()}.oci"
    if (target / "index.json").exists():
        return target
    tarball = rootfs_tarball(recipe, cache_dir=cache_dir, offline=offline, log=log)
    with _locked(cache_dir, recipe.digest()):
        if (target / "index.json").exists():
            return target
        started = time.monotonic()
        tmp = cache_dir / f".{recipe.digest()}.{os.getpid()}.oci"
        shutil.rmtree(tmp, ignore_errors=True)
        image = f"{tmp}:img"
        try:
            _run(["umoci", "init", "--layout", str(tmp)], timeout=60, what="umoci init")
            _run(["umoci", "new", "--image", image], timeout=60, what="umoci new")
            _run(
                ["umoci", "raw", "add-layer", "--image", image, str(tarball)],
                timeout=PACK_TIMEOUT,
                what="umoci raw add-layer",
            )
            _run(
                [
                    "umoci",
                    "config",
                    "--image",
                    image,
                    "--os=linux",
                    f"--architecture={architecture()}",
                    "--author=e2bfacade",
                    f"--config.env=PATH={IMAGE_PATH}",
                    "--config.cmd=bash",
                    f"--config.label=io.e2bfacade.recipe={recipe.name}-{recipe.digest()}",
                ],
                timeout=60,
                what="umoci config",
            )
            shutil.rmtree(target, ignore_errors=True)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"packed {recipe.name} as an OCI image: {time.monotonic() - started:.1f} s")
    return target


def push(layout: Path, registry: str, name: str, *, auth: RegistryAuth | None = None) -> None:
    """Copy the layout's ``img`` into ``registry`` as ``name`` (repository:tag)."""
    parts = urlsplit(registry)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BaseBuildFailed(
            f"the registry must be http://host[:port] or https://…, got {registry!r}"
        )
    try:
        host = registry_host(registry)
    except PullFailed as exc:
        raise BaseBuildFailed(exc.message) from None
    with authfile(host, auth) as auth_args:
        _run(
            [
                "skopeo",
                "copy",
                "--quiet",
                f"--dest-tls-verify={'true' if parts.scheme == 'https' else 'false'}",
                *[a.replace("--authfile", "--dest-authfile") for a in auth_args],
                f"oci:{layout}:img",
                f"docker://{host}/{name}",
            ],
            timeout=PUSH_TIMEOUT,
            what=f"skopeo copy to {host}/{name}",
        )


def _run(argv: list[str], *, timeout: float, what: str) -> None:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**CLEAN_ENV, "HOME": tempfile.gettempdir()},
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise BaseBuildFailed(f"{what} took over {timeout:.0f} s and was stopped") from None
    if done.returncode != 0:
        said = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
        hint = ""
        if argv[0] == "mmdebstrap" and ("Could not resolve" in said or "Failed to fetch" in said):
            hint = " (mmdebstrap needs Debian's mirror: is this machine offline?)"
        raise BaseBuildFailed(f"{what} failed{hint}:\n{said}")


@contextlib.contextmanager
def _locked(cache_dir: Path, key: str) -> Iterator[None]:
    """One builder of a recipe at a time, across processes (seed and a test session)."""
    with open(cache_dir / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
