"""``manage.py run_worker`` stops cleanly on SIGTERM (what systemd, docker stop and
scripts/serve.sh send): it finishes the tick in progress and exits 0 within a tick."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.contract.live_server import REPO, _cleanup_runtime, _database, _manage


def test_run_worker_exits_zero_soon_after_sigterm() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="e2bw-", dir="/tmp"))
    sandbox_root = tmp / "root"
    suite_url = os.environ.get("DATABASE_URL") or f"sqlite:///{REPO / 'db.sqlite3'}"
    try:
        with _database(suite_url, tmp) as database_url:
            env = {
                **os.environ,
                "DATABASE_URL": database_url,
                "SANDBOX_ROOT": str(sandbox_root),
                "DJANGO_SETTINGS_MODULE": "e2bfacade.settings",
                "PYTHONUNBUFFERED": "1",
            }
            _manage(env, "migrate", "--no-input", "-v", "0")
            worker = subprocess.Popen(
                [sys.executable, "manage.py", "run_worker", "--interval", "0.2"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            try:
                # The first tick builds the runtime, which creates SANDBOX_ROOT/sandboxes: by
                # then the worker has installed its signal handlers and is in its loop.
                deadline = time.monotonic() + 60
                while not (sandbox_root / "sandboxes").exists():
                    assert worker.poll() is None, worker.communicate()[0]
                    assert time.monotonic() < deadline, "the worker never ran a tick"
                    time.sleep(0.05)
                time.sleep(0.5)  # a few more ticks

                worker.send_signal(signal.SIGTERM)
                sent = time.monotonic()
                output, _ = worker.communicate(timeout=10)
                took = time.monotonic() - sent
            finally:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait()
            _cleanup_runtime(env, sandbox_root)

        assert worker.returncode == 0, output
        assert took < 3, f"took {took:.1f}s to stop"
        assert "worker stopped" in output
        assert "Traceback" not in output
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
