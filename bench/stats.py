"""What the bench scripts share: nearest-rank percentiles, FIGURE lines, the database."""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with 100 samples, p99 is the second largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def figure(name: str, value: float) -> None:
    """Print one named figure as ``FIGURE <name> <value>``: ``bench/perf_table.py``
    builds docs/performance.md's table of targets from these lines of a ``bench/figures.sh`` run."""
    print(f"FIGURE {name} {value:.6g}", flush=True)


def database_url(sqlite: bool) -> str:
    """The database a bench's server uses: a fresh SQLite file (removed when the bench
    ends) or the PostgreSQL server of ``DATABASE_URL`` (the live server makes its own
    database there)."""
    if sqlite:
        where = tempfile.mkdtemp(prefix="e2bb-")
        atexit.register(shutil.rmtree, where, True)
        return f"sqlite:///{where}/bench.sqlite3"
    return os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/e2bfacade")
