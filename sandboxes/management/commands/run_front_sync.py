"""``python manage.py run_front_sync --socket S --map M``: keep the front's map of which host
holds each sandbox (sandboxes/routes.py) in the HAProxy whose admin socket is ``S`` and whose
configuration routes by the map file ``M``. One per front; it needs only the database."""

from __future__ import annotations

import signal
import threading
from argparse import ArgumentParser
from pathlib import Path
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand

from e2bfacade.fleet.haproxy import Front
from sandboxes.routes import Syncer


class Command(BaseCommand):
    help = "Keep an HAProxy front's sandbox map equal to the database's truth."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--socket", required=True, type=Path, help="HAProxy's admin socket")
        parser.add_argument("--map", required=True, type=Path, help="the map file it routes by")
        parser.add_argument("--resync", type=float, default=30.0, help="seconds between full syncs")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        Syncer(Front(options["socket"], options["map"]), options["resync"]).run(stop)
