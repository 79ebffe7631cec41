"""``python manage.py serve``: every process of the service, supervised as one.

- the API (the control plane): gunicorn with ``--workers`` sync workers on a unix socket,
  behind nginx on ``--bind`` (the front, e2bfacade/front.py: it reads every request whole,
  bounded in size and time, before a worker sees it, so that slow or idle clients hold no
  worker; template file uploads it passes, unbuffered, to the data plane);
  ``--no-front``: gunicorn alone on ``--bind``, for a proxy of one's own in front;
- the data plane (envd's API for every sandbox, and its ports): uvicorn with
  ``--sandbox-workers`` workers on ``--sandbox-bind`` (default: the API's port + 1) — the
  SDK's ``E2B_SANDBOX_URL``, or the target of a front proxy for ``*.<SANDBOX_DOMAIN>``;
- the lifecycle worker (``run_worker``);
- in a fleet (``ETCD_ENDPOINTS``), the host's membership (``run_member``).

The database and ``SANDBOX_ROOT`` come from the environment, as for every command. SIGTERM
or SIGINT stops them all (each finishes what it is doing; a second signal, or
``STOP_SECONDS``, kills them), then ends the runtime's work done ahead (parked launchers,
pooled disks: LocalRuntime.discard_spares); if one of them exits, the others are stopped
and the command exits non-zero, so a supervisor (systemd, a container runtime) restarts
the whole. Sandboxes and their commands outlive all of it.

No process outlives it (e2bfacade/supervision.py): each child gets SIGTERM when this one
dies, even by SIGKILL, and each master's workers when their master dies (nginx's workers,
which have no such signal, run in a process group of their own that serve kills once
nginx's master is gone). A start on an address still held waits ``--port-wait`` seconds
for it (an earlier instance finishing its requests), then fails naming the holder; the API
and the data plane count as up only once the processes started here are the ones
listening.
"""

from __future__ import annotations

import contextlib
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

from e2bfacade import front as fronts
from e2bfacade import supervision
from e2bfacade.runtime.base import SandboxRuntimeError
from nodes.selectors import local_runtime

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
            "--no-front",
            action="store_true",
            help="gunicorn directly on --bind, without nginx in front: no bound on slow or "
            "oversized requests (only behind a proxy of your own that sets them)",
        )
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
        nginx = None
        if not options["no_front"]:
            nginx = fronts.nginx_binary()
            if nginx is None:
                raise CommandError(
                    "nginx is not installed: the API is served behind it, so that slow or "
                    "idle clients cannot hold gunicorn's workers (scripts/setup.sh installs "
                    "Debian's nginx-light). --no-front serves gunicorn directly on --bind, "
                    "for use behind a proxy of your own that bounds requests."
                )
        for bound, port_of, what in (
            (host, port, "--bind"),
            (sandbox_host, sandbox_port, "--sandbox-bind"),
        ):
            try:
                supervision.wait_port_free(bound, port_of, what, options["port_wait"], self._report)
            except supervision.PortHeld as exc:
                raise CommandError(str(exc)) from None
        front = None
        if nginx is not None:
            front = fronts.make(
                host,
                port,
                settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
                uploads=(sandbox_host, sandbox_port),
                upload_limit=settings.TEMPLATE_FILE_MAX_MB << 20,
                upload_seconds=settings.TEMPLATE_UPLOAD_SECONDS,
            )
        try:
            self._serve(options, host, port, sandbox_host, sandbox_port, nginx, front)
        finally:
            if front is not None:
                front.remove()

    def _serve(
        self,
        options: dict[str, Any],
        host: str,
        port: int,
        sandbox_host: str,
        sandbox_port: int,
        nginx: str | None,
        front: fronts.Front | None,
    ) -> None:
        python = sys.executable
        children: dict[str, subprocess.Popen[bytes]] = {}
        stopping = False
        # Every child gets SIGTERM when this process dies, whatever kills it.
        parent = os.getpid()

        def popen(args: list[str], group: bool = False) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                args,
                preexec_fn=partial(supervision.exit_with_parent, parent),
                process_group=0 if group else None,
            )

        def end_front_workers() -> None:
            # nginx's workers get no signal when their master dies: they would go on
            # listening on --bind. They are in the master's process group, and only there.
            if "front" in children:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(children["front"].pid, signal.SIGKILL)

        def stop(signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
            nonlocal stopping
            # A second signal (Ctrl-C twice) does not wait for the children.
            hard = stopping and frame is not None
            stopping = True
            for name, child in children.items():
                if child.poll() is None:
                    # nginx's graceful stop is SIGQUIT (it finishes the requests in hand,
                    # within fronts.SHUTDOWN_SECONDS); its SIGTERM drops them.
                    soft = signal.SIGQUIT if name == "front" else signal.SIGTERM
                    child.send_signal(signal.SIGKILL if hard else soft)

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
                *(front.gunicorn_args() if front is not None else ["--bind", f"{host}:{port}"]),
                # Its default path (~/.gunicorn/gunicorn.ctl) is one per account: a second
                # service on the host would take it over. Nothing here uses it.
                "--no-control-socket",
                "--workers",
                str(options["workers"]),
            ]
        )
        if nginx is not None and front is not None:
            # Its own process group: see end_front_workers.
            children["front"] = popen(front.command(nginx), group=True)
        listener = children.get("front", children["api"])

        def up() -> bool:
            return not stopping and all(c.poll() is None for c in children.values())

        # Once the API answers: its start cleans the metrics directory the others write to.
        base = f"http://{host}:{port}"
        for _ in range(300):
            if not up():
                break
            try:
                # Answered by this nginx or gunicorn, not by a process that took the port
                # meanwhile (gunicorn's socket behind nginx is in a directory of this start).
                # Through nginx, a 502 (gunicorn still booting) is an OSError too.
                if supervision.serves(listener.pid, host, port):
                    urllib.request.urlopen(f"{base}/health", timeout=1).close()
                    break
            except OSError:
                pass
            time.sleep(0.1)
        if up():
            children["sandboxes"] = popen(
                [
                    python, "-m", "sandboxes.dataplane.server",
                    sandbox_host, str(sandbox_port), str(options["sandbox_workers"]),
                ]
            )  # fmt: skip
            if not options["no_worker"]:
                children["worker"] = popen([python, "manage.py", "run_worker"])
            if settings.ETCD_ENDPOINTS:
                # This host's membership of the fleet, and the fence the others read.
                children["member"] = popen([python, "manage.py", "run_member"])
            if settings.SANDBOX_NETWORK is not None:
                # Domain names in allowOut and transform rules (run_egress.py).
                children["egress"] = popen(
                    [python, "manage.py", "run_egress", str(settings.SANDBOX_ROOT)]
                    + [json.dumps(settings.SANDBOX_NETWORK.to_json())]  # this service's own
                )
            for _ in range(300):
                sandboxes = children["sandboxes"]
                if stopping or sandboxes.poll() is not None:
                    break
                if supervision.serves(sandboxes.pid, sandbox_host, sandbox_port):
                    break
                time.sleep(0.1)
            in_front = f", behind nginx pid {children['front'].pid}" if "front" in children else ""
            self.stderr.write(
                f"[serve] API {base} (pid {children['api'].pid}{in_front}), sandboxes "
                f"http://{sandbox_host}:{sandbox_port} (pid {children['sandboxes'].pid})"
                + (f", worker pid {children['worker'].pid}" if "worker" in children else "")
            )
        failed = None
        stop_by = None
        front_ended = False
        while children and any(c.poll() is None for c in children.values()):
            for name, child in children.items():
                if child.poll() is not None and not stopping:
                    failed = name
                    stop()
            if not front_ended and "front" in children and children["front"].poll() is not None:
                # At once, not after the others: a SIGKILLed master leaves its workers on
                # the port until then.
                end_front_workers()
                front_ended = True
            if stopping and stop_by is None:
                stop_by = time.monotonic() + STOP_SECONDS
            if stop_by is not None and time.monotonic() > stop_by:
                for child in children.values():
                    if child.poll() is None:
                        child.kill()
            time.sleep(0.2)
        for child in children.values():
            child.wait()
        if not front_ended:
            end_front_workers()
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
            local_runtime().discard_spares()
        except SandboxRuntimeError as exc:  # a host that cannot run sandboxes has none
            self.stderr.write(f"[serve] the runtime's spares were not discarded: {exc}")
