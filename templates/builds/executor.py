"""One build, run by a build worker holding its lease: the ``base`` phase (an image from a
registry, or a template's), E2B's default-user phase, the steps, and ``finalize``, each
keyed by E2B's hash chain (and the digests of the archives copied so far) in the team's
layer cache, its images named in the team's namespace. Steps run in a sandbox of the runtime's
own (``b-…``: no ``sandboxes`` row; a user namespace, the build's CPU and memory, a disk
quota, the runtime's NAT and blocked ranges), never on the host. The sandbox keeps running
from step to step; its files are captured as a layer (a snapshot: files only) after a slow
step and at the end, so a rebuild that changes a late step starts from there.

No transaction is held while a step runs; everything the build records goes through the
callbacks of :class:`Reporter` (the worker fences them on its lease)."""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from e2bfacade.runtime.base import (
    Capability,
    GuestFileError,
    ImageBuild,
    NetworkPolicy,
    ProcessSpec,
    Runtime,
    SandboxRuntimeError,
    SandboxSpec,
    StartCommand,
    Stream,
    UnknownUser,
)
from e2bfacade.runtime.guest import Guest, run_process
from e2bfacade.runtime.start import run_start_command
from templates.builds import steps as S
from templates.builds.steps import Context, StepFailed

if TYPE_CHECKING:
    from templates.builds.files import Pinned
    from templates.builds.image_cache import ImageCache

logger = logging.getLogger(__name__)
# A step slower than this is worth a layer of its own in the cache.
LAYER_AFTER_SECONDS = 2.0
# Layers a build captures before its finalize, at most. Each is a copy of the sandbox's whole
# writable layer so far (up to the build's disk), so a build of many slow steps would
# otherwise store its files once per step; past this many the steps are not cached.
MAX_LAYERS_PER_BUILD = 8
# Images deeper than this are not built on (the runtime passes each layer to a sandbox as a
# descriptor, at most about 31): the cache is then not used below that point.
MAX_DEPTH = 12
# A template image deeper than this is flattened into one layer (each layer costs a
# sandbox of it a descriptor, and snapshots and forks of it add theirs).
SQUASH_DEPTH = 8
READY_TIMEOUT = 600.0
FINAL_DEFAULT_READY = "sleep 20"


def image_namespace(team_id: int) -> str:
    """The start of every image id a build of the team makes. E2B's hash chain is public
    (anyone computes it from a recipe) and the runtime keeps an image whose id exists, so an
    id made of the chain alone would let one team make, or be handed, another's image."""
    return f"team{team_id}-"


class Canceled(Exception):
    """The build is no longer this worker's (superseded, canceled, or its lease lost)."""


@dataclass(frozen=True)
class Base:
    image_id: str
    key: str  # what the base phase's hash is made of
    context: Context
    label: str  # the log's "FROM …"
    default_user_phase: bool  # E2B's implicit USER user with sudo (not for a template)


@dataclass(frozen=True)
class Layer:
    image_id: str
    context: Context


class Reporter(Protocol):
    def log(self, message: str, *, level: str = "info", step: str = "") -> None: ...
    def alive(self) -> None:
        """Raise Canceled when the build is no longer ours (called between steps)."""

    def cached(self, layer_hash: str) -> Layer | None: ...
    def remember(self, layer_hash: str, layer: Layer) -> None: ...


class Budget(Protocol):
    def check(self, image_id: str | None = None) -> None:
        """Raise StepFailed unless the team's images, with ``image_id`` (just made by the
        build) among them, fit the team's budget."""


@dataclass(frozen=True)
class Plan:
    team_id: int
    template_id: str
    build_id: str
    sandbox_id: str
    cpu_count: int
    memory_mb: int
    disk_mb: int
    spec: dict[str, Any]


@dataclass(frozen=True)
class Result:
    image_id: str
    context: Context


def depth(runtime: Runtime, image_id: str) -> int:
    n, current = 0, image_id
    while current and n < 64:
        n += 1
        current = runtime.image_info(current).parent or ""
    return n


class Execution:
    def __init__(
        self,
        runtime: Runtime,
        plan: Plan,
        base: Base,
        report: Reporter,
        *,
        archive: Callable[[str], Pinned | None],
        internet: bool,
        step_timeout: float,
        budget: Budget,
        host_cache: ImageCache | None = None,
    ) -> None:
        self.runtime, self.plan, self.base, self.report = runtime, plan, base, report
        # The host's image cache (image_cache.py): a build whose whole result it holds is
        # restored from it, and a build it does not hold is kept in it once made.
        self.host_cache = host_cache
        if host_cache is not None:
            self.report = host_cache.recording(report)
        self.archive, self.internet, self.step_timeout = archive, internet, step_timeout
        self.budget = budget
        self.guest: Guest | None = None
        self.pinned: dict[str, Pinned | None] = {}  # files hash -> the archive this build uses
        # The layers captured before the finalize, and the bytes the sandbox's disk used at
        # the last capture (or its start): a step that wrote nothing is not captured again.
        self.layers = 0
        self.disk_used: int | None = None
        self.sandbox_image = ""
        self.current = "base"  # the step running: where a failure is reported
        self.made_final = False  # whether the final image is this build's (not a cache hit)

    # ----------------------------------------------------------------------- the phases
    def run(self) -> Result:
        try:
            return self._phases()
        finally:
            for pinned in self.pinned.values():
                if pinned is not None:
                    pinned.close()

    def _phases(self) -> Result:
        spec, report = self.plan.spec, self.report
        force = bool(spec["force"])
        h = S.chain(S.chain("", *S.HASH_VERSION), str(self.plan.disk_mb), self.base.key)
        report.log(
            f"{'' if force else 'CACHED '}[base] FROM {self.base.label} [{h[:12]}]", step="base"
        )
        layer = Layer(self.base.image_id, self.base.context)
        # (E2B's hash: the log's; the cache key: E2B's hash and the archives' digests, step
        # label, step). ``archives``: the digests of the COPY archives so far, chained.
        todo: list[tuple[str, str, str, dict[str, Any]]] = []
        archives = ""
        if self.base.default_user_phase:
            h = S.chain(h, "DEFAULT USER", S.DEFAULT_USER)
            todo.append((h, h, "base", {"type": "USER", "args": [S.DEFAULT_USER, "true"]}))
        for n, step in enumerate(spec["steps"], 1):
            h = S.step_hash(h, step)
            archives = self._bind_archive(archives, step)
            todo.append((h, _cache_key(h, archives), str(n), step))
        final_key = self._final_key(h)
        final_cache_key = _cache_key(final_key, archives)
        # The longest cached prefix, up to the first forced step: the last step with a
        # layer. Keys chain, so a hit at step i means steps 1..i are those of a past build;
        # only slow steps and the last one keep a layer, so the steps before it need none.
        start = 0
        usable = next(
            (i for i, (*_, step) in enumerate(todo) if force or step.get("force")), len(todo)
        )
        cache = self.host_cache
        if cache is not None and usable == len(todo) and report.cached(final_cache_key) is None:
            restored = cache.restore_build(final_cache_key, final_key, todo, report)
            if restored is not None:
                self._admit(restored.image_id, made=True)
                return Result(restored.image_id, restored.context)
        for i in reversed(range(usable)):
            hit = report.cached(todo[i][1])
            if hit is not None and depth(self.runtime, hit.image_id) <= MAX_DEPTH:
                layer, start = hit, i + 1
                break
        total = len(spec["steps"])
        for i, (key, cache_key, label, step) in enumerate(todo):
            prefix = "[base]" if label == "base" else f"[builder {label}/{total}]"
            text = "DEFAULT USER user" if label == "base" else S.header(step)
            if i < start:
                report.log(f"CACHED {prefix} {text} [{key[:12]}]", step=label)
                continue
            report.alive()
            self.current = label
            report.log(f"{prefix} {text} [{key[:12]}]", step=label)
            began = time.monotonic()
            ctx = self._step(layer, prefix, label, step)
            layer = Layer(layer.image_id, ctx)
            last = i == len(todo) - 1
            slow = time.monotonic() - began > LAYER_AFTER_SECONDS
            if (last or slow) and self._worth_a_layer():
                self.layers += 1
                layer = Layer(self._capture(self._image_id("tl", cache_key)), ctx)
                report.remember(cache_key, layer)
        result = self._finalize(layer, final_key, final_cache_key)
        if cache is not None and self.made_final:  # not a past build's, from the layer cache
            cache.keep_build(final_cache_key, result.image_id, self.plan.build_id)
        return result

    def _final_key(self, h: str) -> str:
        """E2B's hash of the finalize phase: the steps' chain and the commands."""
        start_cmd, ready_cmd = self.plan.spec.get("startCmd"), self.plan.spec.get("readyCmd")
        if start_cmd and not ready_cmd:
            ready_cmd = FINAL_DEFAULT_READY
        return S.chain(h, "FINALIZE", start_cmd or "", ready_cmd or "")

    def _image_id(self, kind: str, cache_key: str) -> str:
        """The id of the image this build makes now for ``cache_key``: the team's name for
        it, or, when an image of that name exists already (a forced step, or a cache entry
        dropped while its image stayed), that name and this build's, since the runtime
        keeps an image whose id exists and the step was just run anew: its fresh files, not
        the old ones, are what this build and the cache then hold."""
        name = f"{image_namespace(self.plan.team_id)}{kind}-{cache_key[:24]}"
        return name if self._absent(name) else f"{name}-{self.plan.build_id.replace('-', '')[:8]}"

    def _bind_archive(self, archives: str, step: dict[str, Any]) -> str:
        """``archives`` with the digest of this step's archive chained on (a COPY's): from here
        on a cached layer stands for these very bytes, whatever files hash the client gave
        them (the server cannot recompute it: see :func:`.files.pin`)."""
        files_hash = step.get("filesHash")
        if step["type"] not in ("COPY", "ADD") or not files_hash:
            return archives
        if files_hash not in self.pinned:
            self.pinned[files_hash] = self.archive(files_hash)
        pinned = self.pinned[files_hash]
        # Missing: a key no layer has (the step fails "never uploaded" when it runs).
        return S.chain(archives, "FILES", pinned.sha256 if pinned else "<missing>")

    def _finalize(self, layer: Layer, key: str, cache_key: str) -> Result:
        spec, report, plan = self.plan.spec, self.report, self.plan
        start_cmd, ready_cmd = spec.get("startCmd"), spec.get("readyCmd")
        if start_cmd and not ready_cmd:
            ready_cmd = FINAL_DEFAULT_READY
        self.current = "finalize"
        hit = None if spec["force"] else report.cached(cache_key)
        report.alive()
        if hit is not None:
            report.log(f"CACHED [finalize] Finalizing template build [{key[:12]}]", step="finalize")
            return Result(hit.image_id, hit.context)
        report.log(f"[finalize] Finalizing template build [{key[:12]}]", step="finalize")
        ctx = layer.context
        self._run_root(
            layer, S.finalize_script(plan.template_id, plan.build_id), "finalize", "[finalize]"
        )
        files = self._capture(self._image_id("tz", cache_key))
        start = None
        if start_cmd:
            start = StartCommand(
                argv=("/bin/bash", "-l", "-c", start_cmd),
                user=ctx.user,
                cwd=ctx.workdir,
                env=ctx.process_env(),
                ready_argv=("/bin/bash", "-l", "-c", ready_cmd or "true"),
                ready_timeout=READY_TIMEOUT,
            )
            self._check_ready(start)
        elif ready_cmd:
            self._check_ready_only(ready_cmd, ctx)
        image_id = self._image_id("tf", cache_key)
        info = self.runtime.build_image(
            ImageBuild(
                image_id=image_id,
                parent=files,
                populate=_nothing,
                env=ctx.env,
                start=start,
                workdir=ctx.workdir,
            )
        )
        image_id = info.image_id
        if depth(self.runtime, image_id) > SQUASH_DEPTH:
            squashed = self._image_id("ts", cache_key)
            made = self._absent(squashed)
            image_id = self.runtime.squash_image(image_id, squashed).image_id
            self._admit(image_id, made=made)
        report.remember(cache_key, Layer(image_id, ctx))
        self.made_final = True
        return Result(image_id, ctx)

    # ------------------------------------------------------------------------ the steps
    def _step(self, layer: Layer, prefix: str, label: str, step: dict[str, Any]) -> Context:
        kind, args, ctx = step["type"], step["args"], layer.context
        if kind == "RUN":
            if not args:
                raise StepFailed("RUN requires a command")
            user = args[1] if len(args) > 1 and args[1] else ctx.user
            self._run(layer, args[0], user=user, cwd=ctx.workdir, prefix=prefix, label=label)
            return ctx
        if kind in ("COPY", "ADD"):
            return self._copy(layer, step, prefix, label)
        if kind in ("ENV", "ARG"):
            if len(args) % 2:
                raise StepFailed("ENV requires both a key and value arguments")
            env = dict(ctx.env)
            for k, v in zip(args[::2], args[1::2], strict=True):
                out = self._run_root(layer, S.env_script(v), label, prefix, ctx=ctx, quiet=True)
                env[k] = out
            return dataclasses.replace(ctx, env=env)
        if kind == "WORKDIR":
            if not args or not args[0]:
                raise StepFailed("WORKDIR requires a path")
            path = args[0] if args[0].startswith("/") else f"{ctx.workdir or '/'}/{args[0]}"
            out = self._run_root(layer, S.workdir_script(path, ctx.user), label, prefix, quiet=True)
            return S.with_workdir(ctx, out.strip().splitlines()[-1] if out.strip() else path)
        if kind == "USER":
            if not args or not args[0]:
                raise StepFailed("USER requires a user name")
            sudo = len(args) > 1 and args[1] == "true"
            self._run_root(layer, S.user_script(args[0], sudo=sudo), label, prefix)
            return dataclasses.replace(ctx, user=args[0])
        raise StepFailed(f"command type {kind} is not implemented")

    def _copy(self, layer: Layer, step: dict[str, Any], prefix: str, label: str) -> Context:
        files_hash = step.get("filesHash")
        if not files_hash:
            raise StepFailed("COPY requires files hash to be set")
        source = self.pinned.get(files_hash)
        if source is None:
            raise StepFailed(f"the files of COPY {' '.join(step['args'][:2])} were never uploaded")
        guest = self._guest(layer)
        archive = f"/tmp/.e2b-copy-{files_hash[:16]}.tar"
        try:
            guest.write_file(archive, _chunks(source.file), user="root")
        except GuestFileError as exc:
            raise StepFailed(f"cannot put the files in the build sandbox: {exc}") from None
        self._run_root(layer, S.copy_script(archive, step, layer.context), label, prefix)
        return layer.context

    # ------------------------------------------------------------------ the sandbox
    def _guest(self, layer: Layer) -> Guest:
        """The build sandbox, started on ``layer`` the first time a step needs it."""
        if self.guest is not None:
            return self.guest
        rt = self.runtime
        rt.kill(self.plan.sandbox_id)  # what an earlier attempt of this build left
        internet = Capability.INTERNET_ACCESS in rt.capabilities and self.internet
        rt.create(
            SandboxSpec(
                sandbox_id=self.plan.sandbox_id,
                image_id=layer.image_id,
                cpu_count=self.plan.cpu_count,
                memory_mb=self.plan.memory_mb,
                disk_mb=self.plan.disk_mb,
                hostname="e2b-build",
                default_user="root",
                network=NetworkPolicy(allow_internet=internet),
                warm_pool=0,
            )
        )
        self.sandbox_image = layer.image_id
        self.guest = rt.guest(self.plan.sandbox_id)
        self.disk_used = self._disk_used()
        return self.guest

    def _capture(self, image_id: str) -> str:
        """The build sandbox's files as a layer image (files only: no process is kept),
        within the team's image budget: a team over it captures nothing, and a capture that
        takes it over is removed again before the build fails."""
        assert self.guest is not None
        self.budget.check()
        made = self._absent(image_id)
        try:
            captured = self.runtime.snapshot(self.plan.sandbox_id, image_id).image_id
        except SandboxRuntimeError as exc:
            raise StepFailed(f"cannot keep the step's files: {exc.message}") from None
        self.disk_used = self._disk_used()
        self._admit(captured, made=made)
        return captured

    def _worth_a_layer(self) -> bool:
        """Whether to capture a layer after this step. A capture copies the whole writable
        layer, so a step that wrote nothing since the last one (its disk's used bytes
        unchanged) is not captured: a rebuild re-runs it from the layer before, instead of
        the build storing its files again. Nor is any past MAX_LAYERS_PER_BUILD."""
        if self.layers >= MAX_LAYERS_PER_BUILD:
            return False
        used = self._disk_used()
        return used is None or used != self.disk_used

    def _disk_used(self) -> int | None:
        """The bytes the build sandbox's disk uses (None: unknown, so a layer is taken)."""
        try:
            return self.runtime.metrics(self.plan.sandbox_id).disk_used
        except SandboxRuntimeError:
            return None

    def _absent(self, image_id: str) -> bool:
        """Whether no image ``image_id`` exists yet (one made now is this build's to remove)."""
        try:
            self.runtime.image_info(image_id)
        except SandboxRuntimeError:
            return True
        return False

    def _admit(self, image_id: str, *, made: bool) -> None:
        """Keep ``image_id`` if the team's images fit its budget with it; else remove it
        (when this build made it) so that a team over its budget is left no more bytes."""
        try:
            self.budget.check(image_id)
        except StepFailed:
            if made:
                try:
                    self.runtime.delete_image(image_id)
                except SandboxRuntimeError:
                    logger.exception("image %s over the team's budget was not removed", image_id)
            raise

    def close(self) -> None:
        if self.guest is not None or self.sandbox_image:
            try:
                self.runtime.kill(self.plan.sandbox_id)
            except SandboxRuntimeError:
                logger.exception("build sandbox %s was not killed", self.plan.sandbox_id)

    # --------------------------------------------------------------------- processes
    def _run(
        self,
        layer: Layer,
        cmd: str,
        *,
        user: str,
        cwd: str | None,
        prefix: str,
        label: str,
        ctx: Context | None = None,
    ) -> None:
        """A RUN: ``bash -l -c`` as ``user``, its output logged line by line."""
        guest = self._guest(layer)
        spec = ProcessSpec(
            argv=("/bin/bash", "-l", "-c", cmd),
            user=user,
            cwd=cwd,
            env=(ctx or layer.context).process_env(),
            timeout=self.step_timeout,
            tag="build",
        )
        began = time.monotonic()
        try:
            proc = guest.start_process(spec)
        except UnknownUser:
            raise StepFailed(
                f"failed to run command '{cmd}': command failed: unauthenticated: "
                f"invalid username: '{user}'"
            ) from None
        except GuestFileError as exc:
            raise StepFailed(f"failed to run command '{cmd}': {exc.message}") from None
        try:
            for stream, line in _lines(proc.output()):
                self.report.log(f"{prefix} [{stream}]: {line}", step=label)
            status = proc.wait()
        finally:
            proc.close()
        if status.signal == signal.SIGKILL and time.monotonic() - began >= self.step_timeout:
            raise StepFailed(
                f"failed to run command '{cmd}': it ran for longer than the step limit of "
                f"{self.step_timeout:g} s (TEMPLATE_STEP_TIMEOUT_SECONDS) and was stopped"
            )
        if status.exit_code != 0:
            raise StepFailed(f"failed to run command '{cmd}': exit status {status.exit_code}")

    def _run_root(
        self,
        layer: Layer,
        script: str,
        label: str,
        prefix: str,
        *,
        ctx: Context | None = None,
        quiet: bool = False,
    ) -> str:
        """One of the builder's own scripts, as guest root; its stdout is returned, its
        output logged unless ``quiet``; a failure is the step's, with what it said."""
        guest = self._guest(layer)
        done = run_process(
            guest,
            ProcessSpec(
                argv=("/bin/bash", "-c", script),
                user="root",
                cwd="/",
                env=(ctx or layer.context).process_env(),
                timeout=self.step_timeout,
                tag="build",
            ),
            max_output=1 << 20,
        )
        out = done.stdout.decode(errors="replace")
        said = done.stderr.decode(errors="replace").strip()
        if not quiet:
            for line in (out + "\n" + said).splitlines():
                if line.strip():
                    self.report.log(f"{prefix} {line}", step=label, level="debug")
        if done.exit_code != 0:
            last = said.splitlines()[-1] if said else f"exit status {done.exit_code}"
            raise StepFailed(last)
        return out

    def _check_ready(self, start: StartCommand) -> None:
        """Run the start command and its ready command once here, as every sandbox of the
        template will: a template whose start never gets ready fails its build."""
        assert self.guest is not None
        self.report.log(f"[finalize] Running start command: {start.argv[-1]}", step="finalize")
        self.report.log(
            f"[finalize] Waiting for template to be ready: {(start.ready_argv or ('',))[-1]}",
            step="finalize",
        )
        try:
            run_start_command(self.guest, start)
        except SandboxRuntimeError as exc:
            raise StepFailed(f"ready command failed: {exc.message}") from None
        self.report.log("[finalize] Template is ready", step="finalize")

    def _check_ready_only(self, ready_cmd: str, ctx: Context) -> None:
        assert self.guest is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            self.report.alive()
            done = run_process(
                self.guest,
                ProcessSpec(
                    argv=("/bin/bash", "-l", "-c", ready_cmd),
                    user=ctx.user,
                    cwd=ctx.workdir,
                    env=ctx.process_env(),
                    timeout=READY_TIMEOUT,
                ),
                max_output=4096,
            )
            if done.exit_code == 0:
                return
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"ready command failed: ready command timed out after {READY_TIMEOUT:g} s"
                )
            time.sleep(1.0)


def _nothing(rootfs: Path) -> None:
    """The final image adds no files: only its environment and start command."""


def _cache_key(key: str, archives: str) -> str:
    """E2B's ``key`` for a step, bound to the archives copied up to it (``archives``): the
    same key as E2B's while no COPY came before."""
    return S.chain(key, "FILES", archives) if archives else key


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    file.seek(0)  # a second COPY of the same archive reads it again from its start
    while chunk := file.read(1 << 20):
        yield chunk


def _lines(output: Iterator[tuple[Stream, bytes]]) -> Iterator[tuple[str, str]]:
    """A process's output as (stream, line) pairs, each line at most 4 KiB."""
    pending: dict[str, bytes] = {}
    for stream, data in output:
        name = "stdout" if stream is not Stream.STDERR else "stderr"
        buf = pending.get(name, b"") + data
        *lines, rest = buf.split(b"\n")
        for line in lines:
            yield name, line[:4096].decode(errors="replace").rstrip("\r")
        pending[name] = rest[-65536:]
    for name, rest in pending.items():
        if rest:
            yield name, rest[:4096].decode(errors="replace")
