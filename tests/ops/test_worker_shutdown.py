"""``manage.py run_worker`` stops cleanly on SIGTERM (what systemd, docker stop and
scripts/serve.sh send): it finishes the tick in progress and exits 0 within a tick."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.support.live_server import REPO, Deployment
from tests.support.waiting import eventually


def test_run_worker_exits_zero_soon_after_sigterm() -> None:
    # A fresh migrated database of the suite's kind and an empty SANDBOX_ROOT; INFO logs, so
    # that the worker's "worker stopped" shows.
    with Deployment(teams=0, prefix="e2bw", log_level=None) as deployment:
        sandbox_root = deployment.sandbox_root
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "run_worker", "--interval", "0.2"],
            cwd=REPO,
            env=deployment.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            # The first tick builds the runtime, which creates SANDBOX_ROOT/sandboxes: by
            # then the worker has installed its signal handlers and is in its loop.
            def ticked() -> bool:
                assert worker.poll() is None, worker.communicate()[0]
                return (sandbox_root / "sandboxes").exists()

            eventually(ticked, within=60, what="the worker's first tick")
            time.sleep(0.5)  # a few more ticks

            worker.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            output, _ = worker.communicate(timeout=10)
            took = time.monotonic() - sent
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()

    assert worker.returncode == 0, output
    assert took < 3, f"took {took:.1f}s to stop"
    assert "worker stopped" in output
    assert "Traceback" not in output
