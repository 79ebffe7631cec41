"""The README's one command, ``bash scripts/serve.sh``, on a first run: what it tells the
user up to the SDK's export lines (it is stopped there, before it serves), run from a copy
of the checkout so that its ``.env``, database and saved key land in a scratch folder."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.live_server import REPO

DEADLINE = 180.0


def checkout_copy(dest: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) under ``dest``, with its venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if not source.is_file():
            continue  # deleted in the work tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    (dest / ".venv").symlink_to(REPO / ".venv")
    return dest


def first_lines(repo: Path) -> list[str]:
    """serve.sh's output up to and including its ``export E2B_API_KEY=`` line."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"sqlite:///{repo}/db.sqlite3",
        SKIP_CODE_INTERPRETER="1",
        PROMETHEUS_MULTIPROC_DIR=str(repo / "metrics"),
        SANDBOX_ROOT=str(repo / "sandbox-root"),  # never the machine's default root
    )
    env.pop("SECRET_KEY", None)  # a first run makes its own, into .env
    proc = subprocess.Popen(
        ["bash", "scripts/serve.sh"],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    began = time.monotonic()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("export E2B_API_KEY=") or time.monotonic() - began > DEADLINE:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    return lines


def test_a_first_serve_shows_the_new_key_once_where_it_says_it_will(tmp_path: Path) -> None:
    lines = first_lines(checkout_copy(tmp_path / "checkout"))
    text = "\n".join(lines)
    assert lines and lines[-1].startswith("export E2B_API_KEY="), text
    key = lines[-1].removeprefix("export E2B_API_KEY=")
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", key), text
    # Shown once: only in its export line, and saved for the next start.
    assert text.count(key) == 1, text
    assert (tmp_path / "checkout" / ".local-api-key").read_text().strip() == key
    # Every promise made about where the key is shown holds.
    for n, line in enumerate(lines[:-1]):
        if "next line" in line:
            assert lines[n + 1] == key, f"{line!r} is followed by {lines[n + 1]!r}"
    assert "shown once, in the E2B_API_KEY line below" in text, text
