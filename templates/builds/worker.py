"""The build worker: claims ``building`` builds under a lease, runs each with
:mod:`.executor`, and finishes it ``ready`` or ``error`` — every write fenced on its lease,
so a worker that lost the build (it was superseded, or the worker stalled past its lease and
another took over) changes nothing. A worker that dies mid-build leaves the lease to run
out; the next claim kills what the dead one left in the runtime and re-drives the build,
its finished steps coming from the layer cache. After ``MAX_ATTEMPTS`` claims the build
ends ``error``: never a half-ready template.

Threads of ``run_worker`` (TEMPLATE_BUILD_CONCURRENCY of them) run it."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.utils import timezone

from e2bfacade import crypto
from e2bfacade.runtime.base import SandboxRuntimeError
from e2bfacade.sandbox_runtime import get_runtime
from templates.builds import bases, files, tags, wakeup
from templates.builds.executor import Base, Canceled, Execution, Layer, Plan
from templates.builds.services import append_log, finish_error
from templates.builds.steps import Context, StepFailed
from templates.models import BuildStatus, LayerCacheEntry, TemplateBuild

logger = logging.getLogger("e2bfacade.builds")
MAX_ATTEMPTS = 3
BUILD_DISK_MB = 4096
LOG_BATCH = 64
LOG_SECONDS = 0.2


def build_sandbox_ids() -> set[str]:
    """The runtime ids of the sandboxes builds are running in (the lifecycle worker's
    reconcile leaves them alone: no ``sandboxes`` row has them)."""
    return {
        b.sandbox_id
        for b in TemplateBuild.objects.filter(status=BuildStatus.BUILDING).only("build_id")
    }


class Lease:
    """This worker's hold on one build, renewed by a thread while the build runs."""

    def __init__(self, build: TemplateBuild, owner: str) -> None:
        self.build, self.owner = build, owner
        self.lost = threading.Event()
        self.done = threading.Event()
        self.on_lost: list[object] = []

    def renew(self) -> bool:
        seconds = settings.TEMPLATE_BUILD_LEASE_SECONDS
        ok = bool(
            TemplateBuild.objects.filter(
                pk=self.build.pk, status=BuildStatus.BUILDING, lease_owner=self.owner
            ).update(lease_until=timezone.now() + timedelta(seconds=seconds))
        )
        if not ok:
            self.lost.set()
        return ok

    def taken_over(self) -> bool:
        """Whether another worker holds the build now (it runs in a sandbox of the same
        id, which this worker must leave alone)."""
        return (
            TemplateBuild.objects.filter(pk=self.build.pk, status=BuildStatus.BUILDING)
            .exclude(lease_owner=self.owner)
            .exists()
        )

    def keep(self, kill: object, flush: object) -> threading.Thread:
        def run() -> None:
            renewed = time.monotonic()
            try:
                while not self.done.wait(LOG_SECONDS):
                    try:
                        flush()  # type: ignore[operator]
                        if time.monotonic() - renewed < settings.TEMPLATE_BUILD_LEASE_SECONDS / 3:
                            continue
                        renewed = time.monotonic()
                        if not self.renew():
                            # Canceled: end its sandbox so the step ends now. Taken over:
                            # the sandbox (its id is the build's) is the new holder's.
                            if not self.taken_over():
                                kill()  # type: ignore[operator]
                            return
                    except DatabaseError:
                        # The database is away (a restart): try again on the next round, on
                        # a new connection. A keeper that ended here would let the lease run
                        # out under a build that is still running.
                        logger.warning("renewing the lease of build %s failed", self.build.pk)
                        connection.close()
                        renewed = 0.0  # due again on the next round
            finally:
                connection.close()  # this thread's own

        thread = threading.Thread(target=run, name=f"lease-{self.build.pk}", daemon=True)
        thread.start()
        return thread


class Reporter:
    """The executor's way of recording: logs, liveness, the team's layer cache."""

    def __init__(self, build: TemplateBuild, lease: Lease) -> None:
        self.build, self.lease = build, lease
        # Entries are written in batches (one transaction per entry cost 5-10 ms: a RUN
        # printing thousands of lines would be slowed by its own log).
        self.pending: list[tuple[str, str, str]] = []
        self.flushed = time.monotonic()
        self.lock = threading.Lock()
        # Set once the log is full: what follows is dropped here, with no transaction per
        # batch (100k lines past the cap cost about 1 500 of them).
        self.full = False

    def log(self, message: str, *, level: str = "info", step: str = "") -> None:
        with self.lock:
            self.pending.append((message, level, step))
        if len(self.pending) >= LOG_BATCH or time.monotonic() - self.flushed > LOG_SECONDS:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
            self.flushed = time.monotonic()
            run: list[str] = []
            key: tuple[str, str] | None = None
            for message, level, step in pending:
                if key is not None and key != (level, step):
                    self._append(run, *key)
                    run = []
                key = (level, step)
                run.append(message)
            if key is not None:
                self._append(run, *key)

    def _append(self, lines: list[str], level: str, step: str) -> None:
        if not self.full:
            self.full = not append_log(self.build, *lines, level=level, step=step)

    def alive(self) -> None:
        self.flush()
        if self.lease.lost.is_set() or not self.lease.renew():
            raise Canceled()

    def cached(self, layer_hash: str) -> Layer | None:
        entry = LayerCacheEntry.objects.filter(
            team_id=self.build.team_id, layer_hash=layer_hash
        ).first()
        if entry is None:
            return None
        try:
            get_runtime().image_info(entry.image_id)
        except SandboxRuntimeError:
            entry.delete()  # its image was swept
            return None
        entry.save(update_fields=["last_used_at"])
        return Layer(entry.image_id, Context.from_json(entry.context))

    def remember(self, layer_hash: str, layer: Layer) -> None:
        LayerCacheEntry.objects.update_or_create(
            team_id=self.build.team_id,
            layer_hash=layer_hash,
            defaults={
                "template_id": self.build.template_id,
                "image_id": layer.image_id,
                "context": layer.context.as_json(),
            },
        )


def claim(owner: str) -> TemplateBuild | None:
    """The oldest ``building`` build nobody holds (never claimed, or its lease ran out)."""
    now = timezone.now()
    with transaction.atomic():
        build = (
            TemplateBuild.objects.select_for_update(skip_locked=True)
            .filter(status=BuildStatus.BUILDING)
            .exclude(lease_until__gt=now)
            .order_by("started_at")
            .first()
        )
        if build is None:
            return None
        build.lease_owner = owner
        build.lease_until = now + timedelta(seconds=settings.TEMPLATE_BUILD_LEASE_SECONDS)
        build.attempts += 1
        build.save(update_fields=["lease_owner", "lease_until", "attempts"])
    return build


def claim_build(build_id: uuid.UUID, owner: str) -> TemplateBuild | None:
    """:func:`claim` of one build: a process that submitted a build (``manage.py
    build_code_interpreter``) runs it itself unless a worker holds it already."""
    now = timezone.now()
    with transaction.atomic():
        build = (
            TemplateBuild.objects.select_for_update(skip_locked=True)
            .filter(pk=build_id, status=BuildStatus.BUILDING)
            .exclude(lease_until__gt=now)
            .first()
        )
        if build is None:
            return None
        build.lease_owner = owner
        build.lease_until = now + timedelta(seconds=settings.TEMPLATE_BUILD_LEASE_SECONDS)
        build.attempts += 1
        build.save(update_fields=["lease_owner", "lease_until", "attempts"])
    return build


def run(build: TemplateBuild, owner: str) -> None:
    """Run one claimed build to its end (or until it is no longer ours)."""
    if build.attempts > MAX_ATTEMPTS:
        get_runtime().kill(build.sandbox_id)
        finish_error(
            build,
            f"the build was interrupted {MAX_ATTEMPTS} times (its build worker ended "
            "mid-build); start it again",
            step=None,
            owner=owner,
        )
        return
    lease = Lease(build, owner)
    report = Reporter(build, lease)
    began = time.monotonic()
    if build.attempts > 1:
        report.log(f"Resuming the build (attempt {build.attempts})", level="warn")
    else:
        report.log(f"Building template {build.template_id}/{build.build_id}")
    runtime = get_runtime()
    spec = build.spec or {}
    plan = Plan(
        template_id=build.template_id,
        build_id=str(build.build_id),
        sandbox_id=build.sandbox_id,
        cpu_count=build.cpu_count,
        memory_mb=build.memory_mb,
        disk_mb=BUILD_DISK_MB,
        spec=spec,
    )
    execution: Execution | None = None
    step = "base"
    keeper = lease.keep(lambda: runtime.kill(build.sandbox_id), report.flush)
    try:
        base = _base(build, spec)
        step = ""
        execution = Execution(
            runtime,
            plan,
            base,
            report,
            archive=lambda h: _archive(build.team_id, h),
            internet=settings.TEMPLATE_BUILD_INTERNET,
            step_timeout=float(settings.TEMPLATE_STEP_TIMEOUT_SECONDS),
        )
        result = execution.run()
        report.flush()
        _finish_ready(build, owner, result.image_id, result.context, began)
    except Canceled:
        logger.info("build %s is no longer this worker's", build.pk)
    except (StepFailed, bases.BaseUnavailable) as exc:
        where = step or (execution.current if execution else "")
        report.flush()
        if lease.lost.is_set():
            logger.info("build %s was canceled mid-step", build.pk)
        else:
            finish_error(build, exc.message, step=where or None, owner=owner)
    except Exception as exc:
        logger.exception("build %s failed", build.pk)
        report.flush()
        finish_error(build, f"internal error: {exc}", step=None, owner=owner)
    finally:
        lease.done.set()
        keeper.join(timeout=5)
        report.flush()
        if execution is not None and not _taken_over(lease):
            execution.close()


def _taken_over(lease: Lease) -> bool:
    try:
        return lease.taken_over()
    except DatabaseError:
        return False  # unknown: end the sandbox, as a run that ends here always did


def _base(build: TemplateBuild, spec: dict[str, object]) -> Base:
    auth = None
    if build.registry_auth:
        auth = json.loads(crypto.decrypt(build.registry_auth))
    return bases.resolve(team_id=build.team_id, spec=spec, auth=auth)


def _archive(team_id: int, files_hash: str) -> Path | None:
    path = files.path_of(team_id, files_hash)
    return path if path.is_file() else None


def _finish_ready(
    build: TemplateBuild, owner: str, image_id: str, context: Context, began: float
) -> None:
    with transaction.atomic():
        updated = TemplateBuild.objects.filter(
            pk=build.pk, status=BuildStatus.BUILDING, lease_owner=owner
        ).update(
            status=BuildStatus.READY,
            image_id=image_id,
            context=context.as_json(),
            finished_at=timezone.now(),
            registry_auth=None,
            lease_owner="",
            lease_until=None,
        )
        if not updated:
            return
        build.refresh_from_db()
        tags.point(build.template, build, list(build.tags), by_request=True)
    took = time.monotonic() - began
    append_log(build, f"Build finished, took {_duration(took)}")


def _duration(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.1f}s"


def new_owner() -> str:
    return f"{socket.gethostname()[:24]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def loop(stop: threading.Event) -> None:
    """Claim and run builds until ``stop`` is set."""
    owner = new_owner()
    waiter = wakeup.Waiter()
    try:
        while not stop.is_set():
            close_old_connections()
            try:
                build = claim(owner)
            except Exception:
                logger.exception("claiming a build failed; trying again")
                build = None
            if build is None:
                waiter.idle(stop)
                continue
            waiter.busy()
            try:
                run(build, owner)
            except Exception:
                # Its finish could not be written (the database went away): the lease runs
                # out and a worker re-drives it; this thread goes on claiming.
                logger.exception("build %s ended without its outcome recorded", build.pk)
    finally:
        waiter.close()


def start_threads(stop: threading.Event) -> list[threading.Thread]:
    threads = []
    for n in range(settings.TEMPLATE_BUILD_CONCURRENCY):
        thread = threading.Thread(target=loop, args=(stop,), name=f"builder-{n}", daemon=True)
        thread.start()
        threads.append(thread)
    return threads
