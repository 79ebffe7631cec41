"""What the bench scripts print: nearest-rank percentiles."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with 100 samples, p99 is the second largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def figure(name: str, value: float) -> None:
    """Print one named figure as ``FIGURE <name> <value>``: ``bench/readme_table.py``
    builds the README's table of targets from these lines of a ``bench/figures.sh`` run."""
    print(f"FIGURE {name} {value:.6g}", flush=True)
