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
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import Count, Max
from django.utils import timezone

from e2bfacade import crypto
from e2bfacade.models import Team
from e2bfacade.runtime.base import SandboxRuntimeError
from nodes.selectors import local_node, local_runtime
from templates.builds import bases, files, image_cache, tags, wakeup
from templates.builds.bounds import ImageBudget
from templates.builds.executor import Base, Canceled, Execution, Layer, Plan, image_namespace
from templates.builds.services import append_log, finish_error
from templates.builds.steps import Context, StepFailed
from templates.models import BUILD_DISK_MB, BuildStatus, LayerCacheEntry, TemplateBuild

logger = logging.getLogger("e2bfacade.builds")
MAX_ATTEMPTS = 3
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
    """This worker's hold on one build, renewed by a thread while the build runs, until
    ``deadline`` (``time.monotonic()``; None: none): past it the keeper ends the build's
    sandbox and sets ``expired`` (and ``lost``, so the executor stops between steps)."""

    def __init__(self, build: TemplateBuild, owner: str, deadline: float | None = None) -> None:
        self.build, self.owner, self.deadline = build, owner, deadline
        self.lost = threading.Event()
        self.expired = threading.Event()
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
                    if self.deadline is not None and time.monotonic() >= self.deadline:
                        # The build's time is up: whatever step runs ends with its sandbox.
                        self.expired.set()
                        self.lost.set()
                        kill()  # type: ignore[operator]
                        return
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
        team_id = self.build.team_id
        entry = LayerCacheEntry.objects.filter(team_id=team_id, layer_hash=layer_hash).first()
        if entry is None:
            return None
        if not entry.image_id.startswith(image_namespace(team_id)):
            # Not an image this team's builds made (a row from before images were the
            # team's): never reused. Dropping the row lets the image sweep reclaim the
            # image once nothing else names it.
            entry.delete()
            return None
        try:
            local_runtime().image_info(entry.image_id)
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


def claim(owner: str, *, host: str) -> TemplateBuild | None:
    """The next build for a build worker of ``host``, under a lease for ``owner``: among the
    ``building`` builds triggered on ``host`` that nobody holds (never claimed, or their
    lease ran out), the oldest of the team served least — fewest builds running, then
    longest since one of its builds started running — so one team's queue never delays
    another team's build by more than a build of its own. A team already running
    TEMPLATE_BUILDS_RUNNING_PER_TEAM builds gets none. Another host's builds are never
    claimed: their COPY archives are on that host."""
    now = timezone.now()
    waiting = list(
        TemplateBuild.objects.filter(status=BuildStatus.BUILDING, host__in=(host, ""))
        .exclude(lease_until__gt=now)
        .order_by("started_at")
        .values_list("pk", "team_id")
    )
    if not waiting:
        return None
    oldest: dict[int, uuid.UUID] = {}  # each team's oldest waiting build, in queue order
    for pk, team_id in waiting:
        oldest.setdefault(team_id, pk)
    running = _running_per_team(set(oldest), now)
    served = dict(
        TemplateBuild.objects.filter(team_id__in=set(oldest), running_since__isnull=False)
        .values("team_id")
        .annotate(last=Max("running_since"))
        .values_list("team_id", "last")
    )
    cap = settings.TEMPLATE_BUILDS_RUNNING_PER_TEAM
    turn = sorted(
        (t for t in oldest if running.get(t, 0) < cap),
        # A team never served sorts first; sorted() is stable, so ties keep queue order.
        key=lambda t: (running.get(t, 0), served.get(t) is not None, served.get(t) or now),
    )
    for team_id in turn:
        build = _claim_one(oldest[team_id], team_id, owner, now, cap)
        if build is not None:
            return build
    return None


def _running_per_team(teams: set[int], now: datetime) -> dict[int, int]:
    """How many builds each of ``teams`` has running (held under a live lease), anywhere."""
    return dict(
        TemplateBuild.objects.filter(
            team_id__in=teams, status=BuildStatus.BUILDING, lease_until__gt=now
        )
        .values("team_id")
        .annotate(n=Count("pk"))
        .values_list("team_id", "n")
    )


def _claim_one(
    pk: uuid.UUID, team_id: int, owner: str, now: datetime, cap: int | None
) -> TemplateBuild | None:
    """Take build ``pk`` unless another worker took it, or its team reached ``cap`` (None:
    no cap), first."""
    with transaction.atomic():
        if cap is not None:
            # The team's row lock serialises the team's claims (on every host): two workers
            # must not both find the team under its cap and both take one of its builds.
            list(Team.objects.select_for_update().filter(pk=team_id).values_list("pk"))
            if _running_per_team({team_id}, now).get(team_id, 0) >= cap:
                return None
        build = (
            TemplateBuild.objects.select_for_update(skip_locked=True)
            .filter(pk=pk, status=BuildStatus.BUILDING)
            .exclude(lease_until__gt=now)
            .first()
        )
        if build is None:
            return None
        build.lease_owner = owner
        build.lease_until = now + timedelta(seconds=settings.TEMPLATE_BUILD_LEASE_SECONDS)
        build.attempts += 1
        # A re-drive keeps its first claim: the build's time limit counts from there.
        build.running_since = build.running_since or now
        build.save(update_fields=["lease_owner", "lease_until", "attempts", "running_since"])
    return build


def claim_build(build_id: uuid.UUID, owner: str) -> TemplateBuild | None:
    """:func:`claim` of one build: a process that submitted a build (``manage.py
    build_code_interpreter``) runs it itself unless a worker holds it already (the service's
    own build: no team's cap applies)."""
    return _claim_one(build_id, 0, owner, timezone.now(), None)


def run(build: TemplateBuild, owner: str) -> None:
    """Run one claimed build to its end (or until it is no longer ours)."""
    if build.attempts > MAX_ATTEMPTS:
        local_runtime().kill(build.sandbox_id)
        finish_error(
            build,
            f"the build was interrupted {MAX_ATTEMPTS} times (its build worker ended "
            "mid-build); start it again",
            step=None,
            owner=owner,
        )
        return
    limit = settings.TEMPLATE_BUILD_TIMEOUT_SECONDS
    # From the build's first claim: a re-drive does not get its time again.
    left = limit - (timezone.now() - (build.running_since or timezone.now())).total_seconds()
    if left <= 0:
        local_runtime().kill(build.sandbox_id)
        finish_error(build, _timed_out(limit), step=None, owner=owner)
        return
    lease = Lease(build, owner, deadline=time.monotonic() + left)
    report = Reporter(build, lease)
    began = time.monotonic()
    if build.attempts > 1:
        report.log(f"Resuming the build (attempt {build.attempts})", level="warn")
    else:
        report.log(f"Building template {build.template_id}/{build.build_id}")
    runtime = local_runtime()
    spec = build.spec or {}
    plan = Plan(
        team_id=build.team_id,
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
        host_cache = image_cache.for_build(
            runtime,
            team_id=build.team_id,
            system=build.team.system,
            base=base.image_id,
            internet=settings.TEMPLATE_BUILD_INTERNET,
        )
        execution = Execution(
            runtime,
            plan,
            base,
            report,
            archive=lambda h: files.pin(build.team_id, h),
            internet=settings.TEMPLATE_BUILD_INTERNET,
            step_timeout=float(settings.TEMPLATE_STEP_TIMEOUT_SECONDS),
            budget=ImageBudget(runtime, build.team_id),
            host_cache=host_cache,
        )
        result = execution.run()
        report.flush()
        _finish_ready(build, owner, result.image_id, result.context, began)
    except Canceled:
        if lease.expired.is_set():
            _finish_timed_out(build, owner, report, execution, limit)
        else:
            logger.info("build %s is no longer this worker's", build.pk)
    except (StepFailed, bases.BaseUnavailable) as exc:
        where = step or (execution.current if execution else "")
        report.flush()
        if lease.expired.is_set():
            # Its step failed because the keeper ended the sandbox: say why.
            _finish_timed_out(build, owner, report, execution, limit)
        elif lease.lost.is_set():
            logger.info("build %s was canceled mid-step", build.pk)
        else:
            finish_error(build, exc.message, step=where or None, owner=owner)
    except Exception as exc:
        report.flush()
        if lease.expired.is_set():
            _finish_timed_out(build, owner, report, execution, limit)
        else:
            logger.exception("build %s failed", build.pk)
            finish_error(build, f"internal error: {exc}", step=None, owner=owner)
    finally:
        lease.done.set()
        keeper.join(timeout=5)
        report.flush()
        if execution is not None and not _taken_over(lease):
            execution.close()


def _timed_out(limit: int) -> str:
    return (
        f"the build ran for longer than its limit of {limit} s "
        "(TEMPLATE_BUILD_TIMEOUT_SECONDS) and was stopped"
    )


def _finish_timed_out(
    build: TemplateBuild, owner: str, report: Reporter, execution: Execution | None, limit: int
) -> None:
    report.flush()
    where = execution.current if execution is not None else "base"
    finish_error(build, _timed_out(limit), step=where or None, owner=owner)


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
            spec_digest="",  # derived from the credentials: not kept after the build
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
                build = claim(owner, host=local_node().host_id)
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
