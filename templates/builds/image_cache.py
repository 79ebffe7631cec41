"""The host's cache of finished system-template images (``TEMPLATE_IMAGE_CACHE_DIR``):
what lets a new sandbox root, or a host whose images are gone, have ``code-interpreter-v1``
again in seconds instead of building it for minutes.

An entry is one build's result: the layers of its final image above ``base`` (each a tar
of the layer's files exactly as the runtime keeps them: owners, modes, times, hard links,
sparse files, extended attributes, ACLs, overlay whiteouts and opaque directories), each
layer's metadata (environment, start command, workdir), the layer cache's entries the build
recorded, and the build's log. It is keyed by :func:`key`, a digest of everything that
shapes the image: the build's last layer-cache key (E2B's hash chain over every step, the
start and ready commands, the build's disk, chained with the digests of every archive
copied), the base image's inputs (the host's Debian packages and the ``/etc`` files base
copies), the code that builds and stores images (the runtime's and the builder's sources),
the runtime's name and whether the build had the internet. A changed input is another key:
a miss, and a build.

Only the system team's builds use it (``for_build``): the service's own templates, whose
inputs are its own files. A team's image is never handed to another team through it.

**Never silently wrong.** An entry is written in a directory beside the cache and renamed
into place once whole, under the entry's lock (``.<name>.lock``, held by its filler, a
restorer and the pruner, who skips a held one): concurrent fillers make it once, and a
reader never sees half of one. Its manifest records every archive's size and sha256; a
restore checks them all before it makes any image, and an entry that fails the check
(corrupt, truncated, partial) is removed and the build runs. Only a chain the restore
reproduces exactly is stored: layers over ``base`` that carry no host binds and no metadata
but environment, start command and workdir (a squashed image, which holds base's files
itself, is not stored).

Bounded like the other host caches (caches.py): entries unused for
``TEMPLATE_IMAGE_CACHE_KEEP_DAYS`` go, and the least recently used while the cache is over
``TEMPLATE_IMAGE_CACHE_MAX_MB``; a store prunes it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from e2bfacade.runtime.base import (
    BUILTIN_IMAGE,
    ImageBuild,
    Runtime,
    SandboxRuntimeError,
    StartCommand,
)
from e2bfacade.runtime.local import HostRuntime
from e2bfacade.runtime.local.storage.image_meta import ImageMeta
from e2bfacade.runtime.local.storage.images import HOST_ETC_COPIES
from templates.builds import caches
from templates.builds import steps as S
from templates.builds.steps import Context

if TYPE_CHECKING:
    from templates.builds.executor import Layer, Reporter

logger = logging.getLogger(__name__)

FORMAT = 2  # of the manifest and the archives: another value is another key
REPO = Path(__file__).resolve().parent.parent.parent
# The code that shapes an image: the runtime (base's recipe, how a step's files are captured
# and an image stored) and the builder (the steps' scripts, the phases, this cache).
CODE = (
    REPO / "e2bfacade/runtime",
    REPO / "templates/builds/executor.py",
    REPO / "templates/builds/steps.py",
    Path(__file__),
)
DPKG_STATUS = Path("/var/lib/dpkg/status")
TAR = ["tar", "--format=posix", "--numeric-owner", "--xattrs", "--xattrs-include=*", "--acls"]
TAR_TIMEOUT = 900.0
MAX_LOG_LINES = 20000


class CacheError(Exception):
    """An entry that cannot be used (corrupt, partial, or of another shape)."""


@dataclass(frozen=True)
class Restored:
    image_id: str  # the final image
    remembered: list[tuple[str, str, dict[str, Any]]]  # (layer hash, image id, context)
    made_by: str  # the build that made the entry
    context: Context  # the final image's (what a build of it on top starts from)


class Recording:
    """A build's reporter that also keeps what the cache stores with its image: the log
    lines and the layer-cache entries the build recorded."""

    def __init__(self, report: Reporter) -> None:
        self.report = report
        self.lines: list[str] = []
        self.remembered: list[tuple[str, str, dict[str, Any]]] = []

    def log(self, message: str, *, level: str = "info", step: str = "") -> None:
        if len(self.lines) < 2 * MAX_LOG_LINES:
            self.lines.append(message)
        self.report.log(message, level=level, step=step)

    def alive(self) -> None:
        self.report.alive()

    def cached(self, layer_hash: str) -> Layer | None:
        return self.report.cached(layer_hash)

    def remember(self, layer_hash: str, layer: Layer) -> None:
        self.remembered.append((layer_hash, layer.image_id, layer.context.as_json()))
        self.report.remember(layer_hash, layer)


# ---------------------------------------------------------------------------------- keys
def _digest_files(digest: Any, roots: tuple[Path, ...]) -> None:
    for root in roots:
        paths = sorted(root.rglob("*")) if root.is_dir() else [root]
        for path in paths:
            if path.is_file() and path.suffix in (".py", ".c", ".h"):
                rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")


def code_digest() -> str:
    digest = hashlib.sha256()
    _digest_files(digest, CODE)
    return digest.hexdigest()


def base_digest() -> str:
    """What the builtin ``base`` image is made of on this host: its ``/usr`` and the rest
    it binds are the host's Debian (its packages' versions), its ``/etc`` copies of the
    host's files (HOST_ETC_COPIES); the recipe itself is in :func:`code_digest`."""
    digest = hashlib.sha256()
    if DPKG_STATUS.is_file():
        digest.update(DPKG_STATUS.read_bytes())
    for name in HOST_ETC_COPIES:
        top = Path("/etc") / name
        paths = sorted(top.rglob("*")) if top.is_dir() and not top.is_symlink() else [top]
        for path in paths:
            digest.update(str(path).encode() + b"\0")
            if path.is_symlink():
                digest.update(b"->" + os.readlink(path).encode())
            elif path.is_file():
                digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def key(*, final_key: str, base: str, runtime: str, internet: bool) -> str:
    """The entry's key: the build's last layer-cache key (its steps, files, commands and
    disk), the base image's digest (``base`` names it: only the builtin base is cached),
    the code's, the runtime's name and whether the build had the internet."""
    parts = [FORMAT, final_key, base, base_digest(), code_digest(), runtime, internet]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


# ------------------------------------------------------------------------------ entries
class ImageCache:
    """The cache of one runtime's builds (its images are read as the local drivers keep
    them: a directory per layer, ``rootfs/`` and ``image.json``)."""

    def __init__(
        self, directory: Path, runtime: HostRuntime, *, namespace: str, base: str, internet: bool
    ) -> None:
        self.directory = directory
        self.runtime = runtime
        self.namespace = namespace  # the team's image ids' start (executor.image_namespace)
        self.base, self.internet = base, internet
        self.recorder: Recording | None = None

    def key_of(self, final_cache_key: str) -> str:
        return key(
            final_key=final_cache_key,
            base=self.base,
            runtime=self.runtime.name,
            internet=self.internet,
        )

    def recording(self, report: Reporter) -> Recording:
        self.recorder = Recording(report)
        return self.recorder

    # ---------------------------------------------------------------- a build's side
    def restore_build(
        self,
        final_cache_key: str,
        final_key: str,
        todo: list[tuple[str, str, str, dict[str, Any]]],
        report: Reporter,
    ) -> Restored | None:
        """The build's image from the cache, its steps logged as the layer cache logs its
        hits and its layer-cache entries recorded; None (the build runs) on a miss or when
        the entry cannot be restored (said in the build's log)."""
        from templates.builds.executor import Layer

        cache_key = self.key_of(final_cache_key)
        began = time.monotonic()
        try:
            restored = self.restore(cache_key)
        except (CacheError, SandboxRuntimeError, OSError, subprocess.SubprocessError) as exc:
            logger.warning("image cache entry %s not restored: %s", cache_key[:32], exc)
            report.log(f"The host's image cache could not restore the image ({exc}): building")
            return None
        if restored is None:
            return None
        total = len(todo) - sum(1 for *_, label, _ in todo if label == "base")
        for h, _, label, step in todo:
            prefix = "[base]" if label == "base" else f"[builder {label}/{total}]"
            text = "DEFAULT USER user" if label == "base" else S.header(step)
            report.log(f"CACHED {prefix} {text} [{h[:12]}]", step=label)
        report.log(
            f"CACHED [finalize] Finalizing template build [{final_key[:12]}]", step="finalize"
        )
        report.log(
            f"[finalize] Restored from the host's image cache: entry {cache_key[:32]}, made by "
            f"build {restored.made_by}, in {time.monotonic() - began:.1f} s",
            step="finalize",
        )
        for layer_hash, image_id, context in restored.remembered:
            report.remember(layer_hash, Layer(image_id, Context.from_json(context)))
        return restored

    def keep_build(self, final_cache_key: str, image_id: str, build_id: str) -> None:
        """Keep the build's final image in the cache (a failure is logged, never the
        build's)."""
        recorder = self.recorder
        cache_key = self.key_of(final_cache_key)
        began = time.monotonic()
        try:
            kept = self.store(
                cache_key,
                image_id,
                recorder.remembered if recorder else [],
                log=recorder.lines if recorder else [],
                made_by=build_id,
            )
        except (CacheError, SandboxRuntimeError, OSError, subprocess.SubprocessError) as exc:
            logger.warning("image %s not kept in the image cache: %s", image_id, exc)
            kept = False
        if kept and recorder is not None:
            recorder.report.log(
                f"[finalize] Kept in the host's image cache: entry {cache_key[:32]} "
                f"({time.monotonic() - began:.1f} s)",
                step="finalize",
            )

    def entry(self, cache_key: str) -> Path:
        return self.directory / cache_key[:32]

    @contextlib.contextmanager
    def locked(self, cache_key: str) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.directory / f".{cache_key[:32]}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    # -------------------------------------------------------------------------- restore
    def restore(self, cache_key: str) -> Restored | None:
        """The entry's image made again in this runtime, with the ids, files and metadata
        the build that made it gave it; None on a miss, or when an image of one of those ids
        is there already (the build then runs, its layer cache finding what it can). An
        entry that fails its check is removed (CacheError is logged, never raised)."""
        entry = self.entry(cache_key)
        with self.locked(cache_key):
            if not entry.is_dir():
                return None
            try:
                manifest = self._checked(entry, cache_key)
            except CacheError as exc:
                logger.warning("image cache entry %s is unusable, removed: %s", entry.name, exc)
                shutil.rmtree(entry, ignore_errors=True)
                return None
            ids = [self.namespace + layer["name"] for layer in manifest["layers"]]
            if any(self._exists(i) for i in ids):
                return None
            made: list[str] = []
            parent = BUILTIN_IMAGE
            try:
                for image_id, layer in zip(ids, manifest["layers"], strict=True):
                    self._make(entry / layer["archive"], image_id, parent, layer["meta"])
                    made.append(image_id)
                    parent = image_id
            except BaseException:
                for image_id in reversed(made):
                    with contextlib.suppress(SandboxRuntimeError):
                        self.runtime.delete_image(image_id)
                raise
            caches.touch(entry / "manifest.json")
            remembered = [
                (r["layer_hash"], self.namespace + r["name"], r["context"])
                for r in manifest["remembered"]
            ]
            final = next((r for r in remembered if r[1] == ids[-1]), None)
            if final is None:
                raise CacheError("the entry records no context for its image")
            return Restored(
                ids[-1], remembered, str(manifest.get("made_by", "")), Context.from_json(final[2])
            )

    def log(self, cache_key: str) -> list[str]:
        """The log of the build that made the entry, a message per item."""
        return read_log(self.entry(cache_key))

    def _checked(self, entry: Path, cache_key: str) -> dict[str, Any]:
        try:
            manifest: dict[str, Any] = json.loads((entry / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise CacheError(f"no readable manifest: {exc}") from None
        if manifest.get("format") != FORMAT or manifest.get("key") != cache_key:
            raise CacheError("the manifest is of another key or format")
        if not manifest.get("layers"):
            raise CacheError("the manifest names no layer")
        for layer in manifest["layers"]:
            path = entry / layer["archive"]
            try:
                size = path.stat().st_size
            except OSError:
                raise CacheError(f"{layer['archive']} is missing") from None
            if size != layer["size"] or _sha256(path) != layer["sha256"]:
                raise CacheError(f"{layer['archive']} is not the archive the entry stored")
        return manifest

    def _make(self, archive: Path, image_id: str, parent: str, meta: dict[str, Any]) -> None:
        start = meta.get("start")

        def populate(rootfs: Path) -> None:
            _tar(["--extract", "--same-owner", "--preserve-permissions", "--file", str(archive),
                  "--directory", str(rootfs)])  # fmt: skip

        self.runtime.build_image(
            ImageBuild(
                image_id=image_id,
                parent=parent,
                populate=populate,
                env=meta.get("env") or {},
                start=_start_command(start) if start else None,
                workdir=meta.get("workdir"),
            )
        )

    def _exists(self, image_id: str) -> bool:
        try:
            self.runtime.image_info(image_id)
        except SandboxRuntimeError:
            return False
        return True

    # ---------------------------------------------------------------------------- store
    def store(
        self,
        cache_key: str,
        image_id: str,
        remembered: list[tuple[str, str, dict[str, Any]]],
        *,
        log: list[str],
        made_by: str,
    ) -> bool:
        """Keep ``image_id`` (a build's final image) as the entry of ``cache_key``, unless
        one is there; False when its chain is not one a restore reproduces exactly."""
        try:
            layers = self._layers(image_id)
        except CacheError as exc:
            logger.info("image %s is not kept in the image cache: %s", image_id, exc)
            return False
        names = {m.image_id: m.image_id.removeprefix(self.namespace) for m in layers}
        entry = self.entry(cache_key)
        with self.locked(cache_key):
            if (entry / "manifest.json").is_file():
                return True  # a concurrent filler's, of the same key
            work = Path(tempfile.mkdtemp(dir=self.directory, prefix=".making-"))
            try:
                manifest = {
                    "format": FORMAT,
                    "key": cache_key,
                    "made_by": made_by,
                    "made_at": time.time(),
                    "layers": [
                        self._pack(work, n, m, names[m.image_id]) for n, m in enumerate(layers)
                    ],
                    "remembered": [
                        {"layer_hash": h, "name": names[i], "context": c}
                        for h, i, c in remembered
                        if i in names
                    ],
                }
                # A JSON list: a log message may hold several lines (a RUN step's header).
                (work / "build-log.json").write_text(json.dumps(log[-MAX_LOG_LINES:]))
                (work / "manifest.json").write_text(json.dumps(manifest))
                shutil.rmtree(entry, ignore_errors=True)  # a removed entry's rest, if any
                os.rename(work, entry)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        prune()
        return True

    def _layers(self, image_id: str) -> list[ImageMeta]:
        """The chain of ``image_id`` above base, bottom first; CacheError unless a restore
        (``build_image`` of each layer's files, environment, start command and workdir)
        would make each exactly."""
        chain = self.runtime.images.chain(image_id)
        if len(chain) < 2 or chain[-1].image_id != BUILTIN_IMAGE:
            raise CacheError("its chain is not over the builtin base")
        layers = list(reversed(chain[:-1]))
        for meta in layers:
            if not meta.image_id.startswith(self.namespace):
                raise CacheError(f"layer {meta.image_id} is not the team's")
            # All but what a restore gives back must be at its default: host binds, a
            # memory checkpoint or another xattr namespace would not be made again.
            rest = dataclasses.replace(
                meta, parent=None, env={}, start=None, workdir=None, size=0, created=0.0,
                xattrs=None,
            )  # fmt: skip
            if rest != ImageMeta(image_id=meta.image_id) or meta.xattrs != "user":
                raise CacheError(f"layer {meta.image_id} has metadata a restore would not make")
        return layers

    def _pack(self, work: Path, n: int, meta: ImageMeta, name: str) -> dict[str, Any]:
        archive = work / f"{n}.tar"
        rootfs = self.runtime.images.layer(meta.image_id)
        _tar(["--create", "--sparse", "--file", str(archive), "--directory", str(rootfs), "."])
        return {
            "name": name,
            "archive": archive.name,
            "size": archive.stat().st_size,
            "sha256": _sha256(archive),
            "meta": {
                "env": dict(meta.env),
                "start": dataclasses.asdict(meta.start) if meta.start else None,
                "workdir": meta.workdir,
            },
        }


def for_build(
    runtime: Runtime, *, team_id: int, system: bool, base: str, internet: bool
) -> ImageCache | None:
    """The cache a build uses: only a system team's build from the builtin base, on a driver
    whose images are directories of this host (the local drivers)."""
    from templates.builds.executor import image_namespace

    if not system or base != BUILTIN_IMAGE or not isinstance(runtime, HostRuntime):
        return None
    return ImageCache(
        settings.TEMPLATE_IMAGE_CACHE_DIR,
        runtime,
        namespace=image_namespace(team_id),
        base=base,
        internet=internet,
    )


def read_log(entry: Path) -> list[str]:
    """The log an entry keeps of the build that made it (empty when it keeps none)."""
    path = entry / "build-log.json"
    return [str(m) for m in json.loads(path.read_text())] if path.is_file() else []


def prune() -> list[Path]:
    """Prune the cache by its settings (a store and the worker's image sweep call it)."""
    return caches.prune(
        caches.image_entries(settings.TEMPLATE_IMAGE_CACHE_DIR),
        keep_seconds=settings.TEMPLATE_IMAGE_CACHE_KEEP_DAYS * caches.DAY,
        max_bytes=settings.TEMPLATE_IMAGE_CACHE_MAX_MB << 20,
    )


def _start_command(start: dict[str, Any]) -> StartCommand:
    fields = {f.name for f in dataclasses.fields(StartCommand)}
    if set(start) - fields:
        raise CacheError(f"a start command of unknown fields {sorted(set(start) - fields)}")
    values = dict(start)
    values["argv"] = tuple(values["argv"])
    if values.get("ready_argv") is not None:
        values["ready_argv"] = tuple(values["ready_argv"])
    return StartCommand(**values)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _tar(args: list[str]) -> None:
    done = subprocess.run(
        [*TAR, *args], capture_output=True, text=True, timeout=TAR_TIMEOUT, check=False
    )
    if done.returncode != 0:
        raise CacheError(f"tar {args[0]} failed: {done.stderr.strip()[-400:]}")
