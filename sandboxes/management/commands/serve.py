"""``python manage.py serve``: every process of the service, supervised as one.

- the API (the control plane): gunicorn with ``--workers`` sync workers on ``--bind``;
- the data plane (envd's API for every sandbox, and its ports): uvicorn with
  ``--sandbox-workers`` workers on ``--sandbox-bind`` (default: the API's port + 1) — the
  SDK's ``E2B_SANDBOX_URL``, or the target of a front proxy for ``*.<SANDBOX_DOMAIN>``;
- the lifecycle worker (``run_worker``).

The database and ``SANDBOX_ROOT`` come from the environment, as for every command. SIGTERM
or SIGINT stops them all (each finishes what it is doing; a second signal, or
``STOP_SECONDS``, kills them), then ends the runtime's work done ahead (parked launchers,
pooled disks: LocalRuntime.discard_spares); if one of them exits, the others are stopped
and the command exits non-zero, so a supervisor (systemd, a container runtime) restarts
the whole. Sandboxes and their commands outlive all of it.

No process outlives it (e2bfacade/supervision.py): each child gets SIGTERM when this one
dies, even by SIGKILL, and each master's workers when their master dies. A start on an
address still held waits ``--port-wait`` seconds for it (an earlier instance finishing its
requests), then fails naming the holder; the API and the data plane count as up only once
the processes started here are the ones listening.
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
from functools import partial
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from e2bfacade import supervision
from e2bfacade.runtime.base import SandboxRuntimeError
from e2bfacade.sandbox_runtime import get_runtime

# How long a stop waits for the children before killing them: above gunicorn's
# graceful_timeout (gunicorn.conf.py), the longest any of them takes to finish its work.
STOP_SECONDS = 45


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
        parser.add_argument(
            "--port-wait",
            type=float,
            default=15.0,
            help="seconds to wait for an address still held by another process (default 15)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = _split(options["bind"], "--bind")
        sandbox_bind = options["sandbox_bind"] or f"{host}:{port + 1}"
        sandbox_host, sandbox_port = _split(sandbox_bind, "--sandbox-bind")
        python = sys.executable
        for bound, port_of, what in (
            (host, port, "--bind"),
            (sandbox_host, sandbox_port, "--sandbox-bind"),
        ):
            try:
                supervision.wait_port_free(bound, port_of, what, options["port_wait"], self._report)
            except supervision.PortHeld as exc:
                raise CommandError(str(exc)) from None
        children: dict[str, subprocess.Popen[bytes]] = {}
        stopping = False
        # Every child gets SIGTERM when this process dies, whatever kills it.
        parent = os.getpid()

        def popen(args: list[str]) -> subprocess.Popen[bytes]:
            return subprocess.Popen(args, preexec_fn=partial(supervision.exit_with_parent, parent))

        def stop(signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
            nonlocal stopping
            # A second signal (Ctrl-C twice) does not wait for the children.
            how = signal.SIGKILL if stopping and frame is not None else signal.SIGTERM
            stopping = True
            for child in children.values():
                if child.poll() is None:
                    child.send_signal(how)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        gunicorn = os.path.join(os.path.dirname(python), "gunicorn")
        children["api"] = popen(
            [
                gunicorn,
                "e2bfacade.wsgi",
                # Its hooks (the workers' parent-death signal among them), wherever the
                # command runs from.
                "--config",
                str(settings.BASE_DIR / "gunicorn.conf.py"),
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
                # Answered by this gunicorn, not by a process that took the port meanwhile.
                if supervision.serves(children["api"].pid, host, port):
                    urllib.request.urlopen(f"{base}/health", timeout=1).close()
                    break
            except OSError:
                pass
            time.sleep(0.1)
        if not stopping and children["api"].poll() is None:
            children["sandboxes"] = popen(
                [
                    python, "-m", "sandboxes.dataplane.server",
                    sandbox_host, str(sandbox_port), str(options["sandbox_workers"]),
                ]
            )  # fmt: skip
            if not options["no_worker"]:
                children["worker"] = popen([python, "manage.py", "run_worker"])
            if settings.SANDBOX_NETWORK is not None:
                # Domain names in allowOut (e2bfacade/runtime/local/net/egress.py).
                children["egress"] = popen(
                    [python, "-m", "e2bfacade.runtime.local.net.egress", str(settings.SANDBOX_ROOT)]
                    + [json.dumps(settings.SANDBOX_NETWORK.to_json())]  # this service's own
                )
            for _ in range(300):
                sandboxes = children["sandboxes"]
                if stopping or sandboxes.poll() is not None:
                    break
                if supervision.serves(sandboxes.pid, sandbox_host, sandbox_port):
                    break
                time.sleep(0.1)
            self.stderr.write(
                f"[serve] API {base} (pid {children['api'].pid}), sandboxes "
                f"http://{sandbox_host}:{sandbox_port} (pid {children['sandboxes'].pid})"
                + (f", worker pid {children['worker'].pid}" if "worker" in children else "")
            )
        failed = None
        stop_by = None
        while children and any(c.poll() is None for c in children.values()):
            for name, child in children.items():
                if child.poll() is not None and not stopping:
                    failed = name
                    stop()
            if stopping and stop_by is None:
                stop_by = time.monotonic() + STOP_SECONDS
            if stop_by is not None and time.monotonic() > stop_by:
                for child in children.values():
                    if child.poll() is None:
                        child.kill()
            time.sleep(0.2)
        for child in children.values():
            child.wait()
        self._discard_work_ahead()
        if failed is not None or (not stopping and children):
            raise CommandError(f"the {failed or 'api'} process exited; stopped the rest")

    def _report(self, message: str) -> None:
        self.stderr.write(f"[serve] {message}")

    def _discard_work_ahead(self) -> None:
        """End the runtime's parked launchers and pooled disks (their mounts and loop
        devices) now that no process of the service can take one; every sandbox stays. A
        service SIGKILLed leaves them, and the next one's pools take them over."""
        try:
            get_runtime().discard_spares()
        except SandboxRuntimeError as exc:  # a host that cannot run sandboxes has none
            self.stderr.write(f"[serve] the runtime's spares were not discarded: {exc}")
