"""``python manage.py run_worker``: the lifecycle worker.

Each tick it (1) applies the timeout action of sandboxes past ``endAt`` (kill, or pause when
``autoPause`` was set), (2) re-drives idempotent requests whose owner died and finishes
sandbox transitions (and volume creates and deletes) abandoned mid-way, and samples each
team's live sandboxes for its metrics, (3) reconciles the database with the runtime, (4)
purges expired idempotency keys, the logs of sandboxes killed long ago and old team
metrics, and sweeps unused images. Several workers may run at once: every step claims its
rows with ``SELECT ... FOR UPDATE SKIP LOCKED`` or a fenced update, so no sandbox is acted
on twice. Template builds run beside the ticks, on threads of their own
(templates.builds.worker; ``--no-builds``: none here).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from argparse import ArgumentParser
from datetime import timedelta
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand
from django.db import close_old_connections
from django.utils import timezone

from e2bfacade.throttling import purge_windows
from idempotency import maintenance as idempotency
from nodes.selectors import local_node
from sandboxes import logs, usage, worker
from sandboxes.models import Sandbox
from sandboxes.volumes.services import volume_sweep
from templates.builds import worker as builds
from templates.services import template_sweep_images

logger = logging.getLogger("e2bfacade.worker")


class Command(BaseCommand):
    adopted = False  # the rows made before hosts were recorded: adopted on the first tick
    help = "Run the lifecycle worker: timeouts, abandoned transitions, reconciliation."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between ticks")
        parser.add_argument("--once", action="store_true", help="run one full tick and exit")
        parser.add_argument(
            "--no-builds", action="store_true", help="do not run template builds here"
        )
        parser.add_argument(
            "--stale-after",
            type=float,
            default=30.0,
            help="seconds after which a transitional state counts as abandoned",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.stopping = False
        worker.raise_open_files_limit()

        def stop(signum: int, frame: FrameType | None) -> None:
            # Finish the tick in progress, then exit: a half-applied step is never left.
            self.stopping = True

        if not options["once"]:  # a one-shot run (tests, cron) keeps the caller's handlers
            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
        interval: float = options["interval"]
        stale_after = timedelta(seconds=options["stale_after"])
        tick = 0
        # Template builds, on threads of their own (a build takes minutes; a tick must not).
        builds_stop = threading.Event()
        if not options["once"] and not options["no_builds"]:
            builds.start_threads(builds_stop)
        while not self.stopping:
            started = time.monotonic()
            close_old_connections()  # survive a database restart between ticks
            try:
                self.tick(tick, stale_after, full=options["once"])
            except Exception:
                logger.exception("worker tick failed; retrying next tick")
            if options["once"]:
                return
            tick += 1
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
        # A build in progress is left to its lease: the next worker re-drives it.
        builds_stop.set()
        self.stdout.write("worker stopped")

    def tick(self, n: int, stale_after: timedelta, *, full: bool) -> None:
        now = timezone.now()
        if not self.adopted:
            if adopted := worker.sandbox_adopt_hostless():
                logger.info("%d sandboxes made before hosts were recorded are this host's", adopted)
            self.adopted = True
        host = local_node().host_id
        expired = Sandbox.objects.expired(now).on_host(host).values_list("pk", flat=True)
        for sandbox_id in list(expired[:200]):
            action = worker.sandbox_expire(sandbox_id=sandbox_id)
            if action:
                logger.info("sandbox %s timed out: %s", sandbox_id, action)
        if full or n % 5 == 0:
            usage.team_metrics_sample(now=now)
            for record_pk in idempotency.drive_abandoned():
                logger.info("idempotency record %s: re-drove an abandoned claim", record_pk)
            for sandbox_id in worker.sandbox_recover_stale(older_than=now - stale_after):
                logger.info("sandbox %s: finished an abandoned transition", sandbox_id)
            for volume_id in volume_sweep(older_than=now - stale_after):
                logger.info("volume %s: removed after an abandoned create or delete", volume_id)
        if full or n % 10 == 0:
            worker.sandbox_keep_warm()
            result = worker.sandbox_reconcile()
            for kind, ids in result.items():
                for sandbox_id in ids:
                    logger.info("reconcile: sandbox %s %s", sandbox_id, kind)
            worker.sandbox_log_limits()
        if full or n % 60 == 0:
            purge_windows()
            purged = idempotency.purge_expired()
            if purged:
                logger.info("purged %d expired idempotency records", purged)
            if purged := logs.sandbox_log_purge(now=now):
                logger.info("purged %d log entries of sandboxes killed long ago", purged)
            usage.team_metrics_purge(now=now)
            for image_id in template_sweep_images():
                logger.info("removed unused image %s", image_id)
