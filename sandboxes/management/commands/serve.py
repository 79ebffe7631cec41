"""``python manage.py serve``: every process of the service, supervised as one.

- the API (the control plane): gunicorn with ``--workers`` sync workers on ``--bind``;
- the data plane (envd's API for every sandbox, and its ports): uvicorn with
  ``--sandbox-workers`` workers on ``--sandbox-bind`` (default: the API's port + 1) — the
  SDK's ``E2B_SANDBOX_URL``, or the target of a front proxy for ``*.<SANDBOX_DOMAIN>``;
- the lifecycle worker (``run_worker``).

The database and ``SANDBOX_ROOT`` come from the environment, as for every command. SIGTERM
or SIGINT stops them all (each finishes what it is doing); if one of them exits, the others
are stopped and the command exits non-zero, so a supervisor (systemd, a container runtime)
restarts the whole. Sandboxes and their commands outlive all of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from argparse import ArgumentParser
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


def _split(bind: str, what: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"{what} must be HOST:PORT, got {bind!r}")
    return host, int(port)


class Command(BaseCommand):
    help = "Serve the API, the data plane and the lifecycle worker, supervised together."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--bind",
            default=os.environ.get("GUNICORN_BIND", "127.0.0.1:3000"),
            help="the API's HOST:PORT (E2B_API_URL); default GUNICORN_BIND or 127.0.0.1:3000",
        )
        parser.add_argument(
            "--sandbox-bind",
            default=None,
            help="the data plane's HOST:PORT (E2B_SANDBOX_URL); default: the API's port + 1",
        )
        parser.add_argument(
            "--workers", type=int, default=int(os.environ.get("WEB_CONCURRENCY", "4"))
        )
        parser.add_argument(
            "--sandbox-workers",
            type=int,
            default=int(os.environ.get("DATAPLANE_WORKERS", "2")),
        )
        parser.add_argument("--no-worker", action="store_true", help="no lifecycle worker")

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = _split(options["bind"], "--bind")
        sandbox_bind = options["sandbox_bind"] or f"{host}:{port + 1}"
        sandbox_host, sandbox_port = _split(sandbox_bind, "--sandbox-bind")
        python = sys.executable
        children: dict[str, subprocess.Popen[bytes]] = {}
        stopping = False

        def stop(signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
            nonlocal stopping
            stopping = True
            for child in children.values():
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        gunicorn = os.path.join(os.path.dirname(python), "gunicorn")
        children["api"] = subprocess.Popen(
            [
                gunicorn,
                "e2bfacade.wsgi",
                "--bind",
                f"{host}:{port}",
                "--workers",
                str(options["workers"]),
            ]
        )
        # Once the API answers: its start cleans the metrics directory the others write to.
        base = f"http://{host}:{port}"
        for _ in range(300):
            if stopping or children["api"].poll() is not None:
                break
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        if not stopping and children["api"].poll() is None:
            children["sandboxes"] = subprocess.Popen(
                [
                    python, "-m", "sandboxes.dataplane.server",
                    sandbox_host, str(sandbox_port), str(options["sandbox_workers"]),
                ]
            )  # fmt: skip
            if not options["no_worker"]:
                children["worker"] = subprocess.Popen([python, "manage.py", "run_worker"])
            if settings.SANDBOX_NETWORK is not None:
                # Domain names in allowOut (e2bfacade/runtime/local/net/egress.py).
                children["egress"] = subprocess.Popen(
                    [python, "-m", "e2bfacade.runtime.local.net.egress", str(settings.SANDBOX_ROOT)]
                    + [json.dumps(settings.SANDBOX_NETWORK.to_json())]  # this service's own
                )
            self.stderr.write(
                f"[serve] API {base} (pid {children['api'].pid}), sandboxes "
                f"http://{sandbox_host}:{sandbox_port} (pid {children['sandboxes'].pid})"
                + (f", worker pid {children['worker'].pid}" if "worker" in children else "")
            )
        failed = None
        while children and any(c.poll() is None for c in children.values()):
            for name, child in children.items():
                if child.poll() is not None and not stopping:
                    failed = name
                    stop()
            time.sleep(0.2)
        for child in children.values():
            child.wait()
        if failed is not None or (not stopping and children):
            raise CommandError(f"the {failed or 'api'} process exited; stopped the rest")
