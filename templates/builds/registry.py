"""Getting an OCI image from a registry into a root file system on this host.

``pull(ref, auth=, mirror=, cache_dir=)`` takes what the E2B SDK sends as ``fromImage``
(``debian:bookworm``, ``e2bdev/base``, ``ghcr.io/org/img:tag``, ``name@sha256:…``),
resolves it to a manifest digest with ``skopeo inspect``, copies the image with
``skopeo copy`` into an OCI layout and flattens its layers with ``umoci raw unpack`` (as
root, owners are kept). ``images.import_pulled`` makes a runtime image of it.

**Where skopeo may connect** (:mod:`.egress`): every connection it makes, redirects and
token realms included, goes through a proxy of this process that resolves the name once
and allows the mirror, the operator's allowance (``TEMPLATE_REGISTRY_ALLOW``) and public
addresses only: never this host's loopback, its own addresses or private ranges otherwise.
Whatever the reason a registry cannot be reached (refused, closed, silent, unresolvable),
the user reads one message; no body a registry or a redirect's target sent is ever quoted
back (skopeo's own words go to the service's log).

**The cache** keeps the flattened tree under a key of where it was pulled from (registry
and repository, as pulled: the mirror's path when there is one) and the manifest digest,
and for a pull with credentials the team too. A second pull of the same key costs the
inspect only, and the inspect is always made, with the caller's own credentials: a team
that serves another's manifest bytes from its own registry, or names the other's image
without its credentials, never gets the other's files.

**References** are normalised as Docker does: a first component with a ``.`` or ``:``, or
``localhost``, names a registry, otherwise the image is Docker Hub's (``docker.io``);
Docker Hub names of one component get ``library/``; a missing tag is ``latest``; a digest
(``@sha256:…``) wins over a tag.

**The mirror** (``TEMPLATE_REGISTRY_MIRROR``, e.g. ``http://127.0.0.1:5055``): when set,
every pull goes to it and never to the image's own registry:

* Docker Hub images map to ``<mirror>/<repository>:<tag>``:
  ``debian:bookworm`` → ``<mirror>/library/debian:bookworm``,
  ``e2bdev/base`` → ``<mirror>/e2bdev/base:latest``;
* other registries to ``<mirror>/<registry host>/<repository>:<tag>``:
  ``ghcr.io/org/img:1`` → ``<mirror>/ghcr.io/org/img:1``; a port in the host becomes
  ``-<port>`` (a repository path has no ``:``): ``localhost:5000/x`` →
  ``<mirror>/localhost-5000/x:latest``.

An ``http://`` mirror is spoken to in plain HTTP (``--src-tls-verify=false``); an
``https://`` one has its certificate verified.

**Credentials** (E2B's ``fromImageRegistry`` of type ``registry``) are presented to the
registry the pull goes to (the mirror, when one is set), through an auth file of mode 0600
in a private temporary directory, deleted when the pull ends: never on a command line
(visible in ``/proc``), never logged, never stored, never in an error message. Types
``aws`` and ``gcp`` are refused with a clear error. skopeo runs with a clean environment
and a ``HOME`` of its own, so no credential of this host's (``~/.docker``,
``$XDG_RUNTIME_DIR/containers``) is ever used. Image signatures are not verified.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from templates.builds import caches, egress
from templates.builds.pull_errors import explain

log = logging.getLogger(__name__)

DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io")
DEFAULT_MAX_MB = 4096
# Bounds of each step (seconds): an inspect is one or two requests; a copy and an unpack
# are proportional to the image (about 1 s and 10 s for 60 MB here).
INSPECT_TIMEOUT = 60.0
COPY_TIMEOUT = 900.0
UNPACK_TIMEOUT = 900.0
CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HOST = re.compile(r"^[A-Za-z0-9.-]+(?::[0-9]{1,5})?$")


class PullFailed(Exception):
    """The image could not be pulled; ``message`` is for the user (it names the image,
    never a credential)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class RegistryAuth:
    username: str
    password: str = dataclasses.field(repr=False)

    @classmethod
    def from_wire(cls, value: Mapping[str, Any] | None) -> RegistryAuth | None:
        """E2B's ``fromImageRegistry``: ``{type: "registry", username, password}``. The
        cloud types are refused: this server holds no cloud identity to sign in with."""
        if value is None:
            return None
        kind = value.get("type")
        if kind in ("aws", "gcp"):
            raise PullFailed(
                f"private registry credentials of type {kind!r} are not supported by this "
                "server; use type 'registry' with a username and password"
            )
        if kind != "registry":
            raise PullFailed(f"fromImageRegistry type {kind!r} is unknown; use 'registry'")
        username, password = value.get("username"), value.get("password")
        if not isinstance(username, str) or not username or not isinstance(password, str):
            raise PullFailed("fromImageRegistry of type 'registry' needs a username and a password")
        return cls(username=username, password=password)


@dataclass(frozen=True)
class ImageRef:
    registry: str  # "docker.io" or a host[:port]
    repository: str  # "library/debian"
    tag: str  # "latest" when none was given
    digest: str | None = None

    def __str__(self) -> str:
        name = f"{self.registry}/{self.repository}"
        return f"{name}@{self.digest}" if self.digest else f"{name}:{self.tag}"

    def source(self, mirror: str | None) -> str:
        """Where to pull from: ``host/repository`` plus ``:tag`` or ``@digest``."""
        if mirror is None:
            host = self.registry
            path = self.repository
        else:
            host = registry_host(mirror)
            path = self.repository
            if self.registry != DOCKER_HUB:
                path = f"{self.registry.lower().replace(':', '-')}/{path}"
        return f"{host}/{path}" + (f"@{self.digest}" if self.digest else f":{self.tag}")


@dataclass(frozen=True)
class Pulled:
    """A pulled image: its manifest digest, its flattened root file system (in the cache:
    read it, never change it), and what its OCI config says a container starts with."""

    ref: str  # the normalised reference
    digest: str
    key: str  # the cache entry's name: who may share it (see the module's docstring)
    rootfs: Path
    env: Mapping[str, str]
    user: str
    workdir: str
    cmd: tuple[str, ...]
    entrypoint: tuple[str, ...]
    compressed_bytes: int
    cached: bool  # True: the digest was in the cache, nothing was copied


def parse_ref(ref: str) -> ImageRef:
    """Normalise a ``fromImage`` as Docker does (see the module's docstring)."""
    text = ref.strip() if isinstance(ref, str) else ""
    if not text or len(text) > 512 or any(c.isspace() for c in text):
        raise PullFailed(f"{ref!r} is not an image reference")
    digest = None
    if "@" in text:
        text, digest = text.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise PullFailed(f"{ref!r}: the digest must be sha256: and 64 hex digits")
    first, _, rest = text.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        if not _HOST.fullmatch(first):
            raise PullFailed(f"{ref!r}: {first!r} is not a registry host")
        registry = DOCKER_HUB if first.lower() in DOCKER_HUB_ALIASES else first
        remainder = rest
    else:
        registry, remainder = DOCKER_HUB, text
    tag = "latest"
    slash = remainder.rfind("/")
    if ":" in remainder[slash + 1 :]:
        remainder, tag = remainder.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise PullFailed(f"{ref!r}: {tag!r} is not a valid tag")
    if not _REPOSITORY.fullmatch(remainder):
        raise PullFailed(
            f"{ref!r}: {remainder!r} is not a valid repository name (lowercase letters, digits, "
            "separators '.', '_', '-', components joined by '/')"
        )
    if registry == DOCKER_HUB and "/" not in remainder:
        remainder = f"library/{remainder}"
    return ImageRef(registry=registry, repository=remainder, tag=tag, digest=digest)


def registry_host(url: str) -> str:
    """``host[:port]`` of a registry URL (``http://127.0.0.1:5055`` → ``127.0.0.1:5055``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise PullFailed(
            f"a registry is given as http://host[:port] or https://host[:port], not {url!r}"
        )
    return parts.netloc


@contextlib.contextmanager
def authfile(host: str, auth: RegistryAuth | None) -> Iterator[list[str]]:
    """skopeo's arguments for ``auth`` at ``host``: ``--authfile <file>`` of a file only this
    process's user can read, removed on exit; without ``auth``, ``--no-creds``-style
    anonymity is the caller's (an empty list)."""
    if auth is None:
        yield []
        return
    with tempfile.TemporaryDirectory(prefix="e2bfacade-auth-") as private:  # mode 0700
        path = Path(private) / "auth.json"
        token = base64.b64encode(f"{auth.username}:{auth.password}".encode()).decode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"auths": {host: {"auth": token}}}, out)
        try:
            yield ["--authfile", str(path)]
        finally:
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class _Route:
    """How skopeo reaches the registry of one pull: TLS, its credentials' arguments, and
    where it may connect."""

    tls: str
    auth_args: list[str]
    rules: egress.Rules
    forward: list[tuple[egress.IPAddress, int]]


def pull(
    ref: str,
    *,
    auth: RegistryAuth | None,
    mirror: str | None,
    cache_dir: Path,
    team_id: int,
    allow: Sequence[str] = (),
    max_mb: int = DEFAULT_MAX_MB,
) -> Pulled:
    """Pull ``ref`` (from ``mirror`` when set) into ``cache_dir``, or find it there, for
    team ``team_id`` (the owner of what a pull with ``auth`` caches). ``allow``: what the
    pull may reach besides public addresses and the mirror (:class:`egress.Rules`). Raises
    PullFailed with a user-facing message. Safe to call concurrently: one puller per cache
    entry copies, the others wait for it."""
    image = parse_ref(ref)
    source = image.source(mirror)
    host = source.split("/", 1)[0]
    tls = "true"
    scheme = "https"
    if mirror is not None and urlsplit(mirror).scheme == "http":
        tls, scheme = "false", "http"
    try:
        rules = egress.Rules.of(mirror=mirror, allow=allow)
    except ValueError as exc:
        raise PullFailed(f"TEMPLATE_REGISTRY_ALLOW: {exc}") from None
    parts = urlsplit(f"//{host}")
    forward = egress.loopback_targets(
        parts.hostname or host, parts.port or egress.default_port(scheme), rules
    )
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with authfile(host, auth) as auth_args:
        route = _Route(tls, auth_args or ["--no-creds"], rules, forward)
        digest, manifest = _resolve(source, route=route, ref=ref, auth=auth, scratch=cache_dir)
        try:
            sizes = [int(layer["size"]) for layer in manifest["layers"]]
        except (KeyError, TypeError, ValueError):
            raise PullFailed(f"the registry's manifest of {ref!r} lists no layer sizes") from None
        name = source.rsplit("@", 1)[0] if image.digest else source.rsplit(":", 1)[0]
        entry = cache_dir / cache_key(name, digest, team_id=team_id if auth else None)
        if (entry / "image.json").exists():
            return _pulled(image, entry, cached=True)
        compressed = sum(sizes)
        if compressed > max_mb * 1024 * 1024:
            raise PullFailed(
                f"image {ref!r} is {compressed / 1048576:.0f} MB compressed, over this "
                f"server's limit of {max_mb} MB (TEMPLATE_IMAGE_MAX_MB)"
            )
        with _locked(cache_dir, entry.name):
            if (entry / "image.json").exists():
                return _pulled(image, entry, cached=True)
            # By digest, not tag: what is copied is what was inspected and sized, even if
            # the tag moves meanwhile.
            _fetch(f"{name}@{digest}", entry, digest=digest, route=route, ref=ref, auth=auth)
    log.info("pulled %s (%s, %d bytes compressed)", image, digest, compressed)
    return _pulled(image, entry, cached=False)


def cache_key(name: str, digest: str, *, team_id: int | None) -> str:
    """The cache entry of image ``name`` (``host/repository`` as pulled) at ``digest``:
    shared by every anonymous pull of it, the team's own for a pull with credentials."""
    scope = f"{name}@{digest}" + (f"#team={team_id}" if team_id is not None else "")
    return hashlib.sha256(scope.encode()).hexdigest()


INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


def _resolve(
    source: str,
    *,
    route: _Route,
    ref: str,
    auth: RegistryAuth | None,
    scratch: Path,
) -> tuple[str, dict[str, Any]]:
    """The digest and manifest of ``source``'s image for this machine: an index (a
    multi-platform image) is followed to its linux/<arch> manifest."""
    name = source.rsplit("@", 1)[0] if "@" in source else source.rsplit(":", 1)[0]
    target = source
    for _ in range(2):  # an image, or an index and then its image
        raw = _skopeo(
            [
                "inspect",
                "--raw",
                f"--tls-verify={route.tls}",
                *route.auth_args,
                f"docker://{target}",
            ],
            route=route,
            timeout=INSPECT_TIMEOUT,
            ref=ref,
            auth=auth,
            scratch=scratch,
        )
        try:
            manifest = json.loads(raw)
        except ValueError:
            raise PullFailed(f"the registry's answer for {ref!r} is not a manifest") from None
        if not isinstance(manifest, dict):
            raise PullFailed(f"the registry's answer for {ref!r} is not a manifest")
        if manifest.get("mediaType") not in INDEX_TYPES and "manifests" not in manifest:
            if manifest.get("schemaVersion") != 2:
                raise PullFailed(f"{ref!r} has a schema 1 manifest, which is not supported")
            return "sha256:" + hashlib.sha256(raw).hexdigest(), manifest
        arch = architecture()
        wanted = [
            m
            for m in manifest.get("manifests") or ()
            if isinstance(m, dict)
            and (m.get("platform") or {}).get("os") == "linux"
            and (m.get("platform") or {}).get("architecture") == arch
        ]
        if not wanted or not _DIGEST.fullmatch(str(wanted[0].get("digest"))):
            raise PullFailed(f"image {ref!r} has no linux/{arch} variant")
        target = f"{name}@{wanted[0]['digest']}"
    raise PullFailed(f"image {ref!r} is an index of indexes, which is not supported")


def architecture() -> str:
    """This machine's architecture as OCI names it."""
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _fetch(
    source: str,
    entry: Path,
    *,
    digest: str,
    route: _Route,
    ref: str,
    auth: RegistryAuth | None,
) -> None:
    """Copy, flatten and publish ``source`` as cache entry ``entry`` (by rename: a reader
    never sees half an entry)."""
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    try:
        layout = tmp / "oci"
        copy_args = [a.replace("--authfile", "--src-authfile") for a in route.auth_args]
        copy_args = [a.replace("--no-creds", "--src-no-creds") for a in copy_args]
        started = time.monotonic()
        _skopeo(
            [
                "copy",
                "--quiet",
                f"--src-tls-verify={route.tls}",
                *copy_args,
                f"docker://{source}",
                f"oci:{layout}:img",
            ],
            route=route,
            timeout=COPY_TIMEOUT,
            ref=ref,
            auth=auth,
            scratch=tmp,
        )
        copied = time.monotonic()
        config = _image_config(layout)
        _run_umoci(["raw", "unpack", "--image", f"{layout}:img", str(tmp / "rootfs")], ref=ref)
        dropped = drop_special_files(tmp / "rootfs")
        if dropped:
            log.info(
                "%s: left out %d device nodes, FIFOs and sockets: %s",
                ref,
                len(dropped),
                ", ".join(dropped[:20]),
            )
        shutil.rmtree(layout)
        (tmp / "image.json").write_text(json.dumps({**config, "digest": digest}))
        log.info("%s: copy %.1f s, unpack %.1f s", ref, copied - started, time.monotonic() - copied)
        os.rename(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def drop_special_files(rootfs: Path) -> list[str]:
    """Remove device nodes, FIFOs and sockets from ``rootfs`` (never following a link):
    a sandbox gets the runtime's /dev, and the runtime refuses them in an image. Returns
    the guest paths removed."""
    dropped: list[str] = []
    for top, dirs, files in os.walk(rootfs):
        for name in files + dirs:
            path = os.path.join(top, name)
            mode = os.lstat(path).st_mode
            if (
                stat.S_ISCHR(mode)
                or stat.S_ISBLK(mode)
                or stat.S_ISFIFO(mode)
                or stat.S_ISSOCK(mode)
            ):
                os.unlink(path)
                dropped.append("/" + os.path.relpath(path, rootfs))
    return sorted(dropped)


def _image_config(layout: Path) -> dict[str, Any]:
    """What the OCI config of the layout's ``img`` says a container starts with."""
    index = json.loads((layout / "index.json").read_text())
    manifest = next(
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == "img"
    )
    manifest_json = json.loads(_blob(layout, manifest["digest"]))
    config = json.loads(_blob(layout, manifest_json["config"]["digest"])).get("config") or {}
    env: dict[str, str] = {}
    for item in config.get("Env") or ():
        key, sep, value = str(item).partition("=")
        if sep and key:
            env[key] = value
    return {
        "env": env,
        "user": str(config.get("User") or ""),
        "workdir": str(config.get("WorkingDir") or ""),
        "cmd": [str(a) for a in config.get("Cmd") or ()],
        "entrypoint": [str(a) for a in config.get("Entrypoint") or ()],
        "compressed": sum(int(layer.get("size", 0)) for layer in manifest_json.get("layers", ())),
    }


def _blob(layout: Path, digest: str) -> bytes:
    algorithm, _, value = digest.partition(":")
    if algorithm != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise PullFailed(f"the image names an unsupported blob digest {digest[:80]!r}")
    return (layout / "blobs" / algorithm / value).read_bytes()


def _pulled(image: ImageRef, entry: Path, *, cached: bool) -> Pulled:
    if cached:
        caches.touch(entry / "image.json")  # used now: pruning keeps the recently used
    meta = json.loads((entry / "image.json").read_text())
    return Pulled(
        ref=str(image),
        digest=str(meta["digest"]),
        key=entry.name,
        rootfs=entry / "rootfs",
        env=dict(meta["env"]),
        user=meta["user"],
        workdir=meta["workdir"],
        cmd=tuple(meta["cmd"]),
        entrypoint=tuple(meta["entrypoint"]),
        compressed_bytes=int(meta["compressed"]),
        cached=cached,
    )


def _skopeo(
    args: list[str],
    *,
    route: _Route,
    timeout: float,
    ref: str,
    auth: RegistryAuth | None,
    scratch: Path,
) -> bytes:
    """Run skopeo confined to ``route.rules`` (:mod:`.egress`), with a clean environment,
    and a HOME and TMPDIR of its own in ``scratch`` (beside the cache: a copy's temporary
    blobs can be large, and /tmp may be memory)."""
    argv = ["skopeo", "--insecure-policy", f"--command-timeout={int(timeout)}s", *args]
    with tempfile.TemporaryDirectory(prefix=".skopeo-", dir=scratch) as home:
        try:
            done = egress.run(
                argv,
                env={**CLEAN_ENV, "HOME": home, "TMPDIR": home},
                timeout=timeout + 10,
                rules=route.rules,
                forward=route.forward,
            )
        except subprocess.TimeoutExpired:
            raise PullFailed(f"pulling {ref!r} took over {timeout:.0f} s and was stopped") from None
        except egress.ConfinementFailed as exc:
            log.error("cannot confine skopeo for %s: %s", ref, exc)
            raise PullFailed(
                f"this server cannot pull {ref!r}: its puller could not be started"
            ) from None
    if done.returncode == 0:
        return done.stdout  # bytes as the registry sent them: a manifest's digest is theirs
    said = _redact(done.stderr.decode(errors="replace"), auth)
    # skopeo's words may quote what a registry sent: the operator's log has them, the user
    # a message of ours.
    log.warning("skopeo failed for %s: %s", ref, said.strip()[-2000:])
    raise PullFailed(explain(ref, said, with_credentials=auth is not None))


def _redact(text: str, auth: RegistryAuth | None) -> str:
    if auth is None or not auth.password:
        return text
    return text.replace(auth.password, "***").replace(auth.username, "***")


def _run_umoci(args: list[str], *, ref: str) -> None:
    try:
        done = subprocess.run(
            ["umoci", *args],
            capture_output=True,
            text=True,
            timeout=UNPACK_TIMEOUT,
            env=CLEAN_ENV,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise PullFailed(
            f"unpacking {ref!r} took over {UNPACK_TIMEOUT:.0f} s and was stopped"
        ) from None
    if done.returncode != 0:
        raise PullFailed(f"cannot unpack {ref!r}: {done.stderr.strip()[-400:]}")


@contextlib.contextmanager
def _locked(cache_dir: Path, key: str) -> Iterator[None]:
    with open(cache_dir / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
