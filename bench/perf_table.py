"""Write docs/performance.md's table of the hot path's targets from ``bench/figures.sh`` runs.

    .venv/bin/python bench/perf_table.py RUN.txt [RUN.txt ...] [--doc docs/performance.md]

Reads the ``FIGURE <name> <value>`` lines the benches print (``bench/stats.figure``), takes
each figure's median over the runs given, and replaces what stands between the document's
``<!-- figures:begin`` and ``<!-- figures:end -->`` markers. A figure no run has (its bench
failed, or was not run) is written as such, never carried over from an older table.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BEGIN = "<!-- figures:begin"
END = "<!-- figures:end -->"

DOC = Path(__file__).parents[1] / "docs" / "performance.md"

Figures = dict[str, float]


@dataclass(frozen=True)
class Row:
    target: str
    # (figures, "pg" | "sqlite") -> (what to print, met?) or None when a figure is missing
    measure: Callable[[Figures, str], tuple[str, bool] | None]
    backends: tuple[str, ...] = ("pg", "sqlite")


def _get(f: Figures, *names: str) -> list[float] | None:
    values = [f.get(n) for n in names]
    return None if any(v is None for v in values) else [v for v in values if v is not None]


def _ratio(kind: str) -> Callable[[Figures, str], tuple[str, bool] | None]:
    def measure(f: Figures, db: str) -> tuple[str, bool] | None:
        got = _get(f, f"{db}.create.{kind}.ratio", f"{db}.create.{kind}.sdk_p50",
                   f"{db}.create.{kind}.floor")  # fmt: skip
        if got is None:
            return None
        ratio, sdk, floor = got
        return f"{ratio:.2f}× ({sdk:.1f} ÷ {floor:.1f} ms)", ratio <= 3.0

    return measure


def _keyed(f: Figures, db: str) -> tuple[str, bool] | None:
    got = _get(f, f"{db}.keyed.ratio", f"{db}.keyed.keyed_p50", f"{db}.keyed.unkeyed_p50")
    if got is None:
        return None
    ratio, keyed, unkeyed = got
    return f"{ratio:.3f} ({keyed:.1f} ÷ {unkeyed:.1f} ms)", ratio <= 1.10


def _replay(f: Figures, db: str) -> tuple[str, bool] | None:
    got = _get(f, f"{db}.replay.p50", f"{db}.replay.floor_p50")
    if got is None:
        return None
    p50, floor = got
    return f"{p50:.2f} ms (any authenticated GET: {floor:.2f} ms)", p50 <= 3.0


def _v2_list(f: Figures, db: str) -> tuple[str, bool] | None:
    got = _get(f, f"{db}.list.v2_10000.p50", f"{db}.list.v2_100.p50")
    if got is None:
        return None
    big, small = got
    return f"{big / small:.2f}× ({big:.2f} ÷ {small:.2f} ms)", big / small <= 1.5


def _v1_list(f: Figures, db: str) -> tuple[str, bool] | None:
    got = _get(f, f"{db}.list.v1_10000.p50")
    return None if got is None else (f"{got[0]:.1f} ms", got[0] <= 50)


def _throughput(f: Figures, db: str) -> tuple[str, bool] | None:
    got = _get(f, f"{db}.throughput.32.rate", f"{db}.throughput.32.p99")
    if got is None:
        return None
    rate, p99 = got
    return f"{rate:.1f}/s, p99 {p99:.0f} ms", rate >= 1.5 * 125 and p99 <= 150


def _reconcile(f: Figures, db: str) -> tuple[str, bool] | None:
    got = _get(f, f"{db}.reconcile.1000.tick_p50")
    return None if got is None else (f"{got[0]:.1f} ms", got[0] <= 20)


def _pool(f: Figures, db: str) -> tuple[str, bool] | None:
    got = _get(f, f"{db}.create.pool_cold.sdk_p50", f"{db}.create.pool_b2b.sdk_p50")
    if got is None:
        return None
    cold, b2b = got
    return f"{cold:.1f} ms cold, {b2b:.1f} ms back to back", max(cold, b2b) <= 8.0


ROWS = [
    Row("SDK create ÷ its floor, cold: ≤ 3×", _ratio("cold")),
    Row("SDK create ÷ its floor, back to back: ≤ 3×", _ratio("b2b")),
    Row("keyed ÷ unkeyed SDK create: ≤ 1.10", _keyed),
    Row("replay of a keyed create, p50: ≤ 3 ms", _replay),
    Row("`GET /v2/sandboxes?limit=100`, 10 000 live ÷ 100 live: ≤ 1.5×", _v2_list, ("pg",)),
    Row("v1 list at 10 000 live (8 572 running), p50: ≤ 50 ms", _v1_list, ("pg",)),
    Row("keyed creates at 32 clients: ≥ 187.5/s, p99 ≤ 150 ms", _throughput, ("pg",)),
    Row("reconcile tick at 1 000 sandboxes, p50: ≤ 20 ms", _reconcile),
    Row("SDK create with a warm pool, p50: ≤ 8 ms", _pool),
]


def parse(*texts: str) -> Figures:
    """Each figure's median over the runs ``texts`` that have it."""
    seen: dict[str, list[float]] = {}
    for text in texts:
        for match in re.finditer(r"^FIGURE (\S+) (\S+)$", text, re.MULTILINE):
            seen.setdefault(match.group(1), []).append(float(match.group(2)))
    return {name: statistics.median(values) for name, values in seen.items()}


def table(figures: Figures, source: str) -> str:
    lines = [
        f"{BEGIN} (written by bench/perf_table.py from {source}; do not edit) -->",
        "| hot-path target | PostgreSQL | SQLite | |",
        "|---|---|---|---|",
    ]
    for row in ROWS:
        cells, verdict = [], ""
        for db in ("pg", "sqlite"):
            if db not in row.backends:
                cells.append("(PostgreSQL only)")
                continue
            got = row.measure(figures, db)
            if got is None:
                cells.append("not measured in this run")
                continue
            cells.append(got[0])
            if db == "pg":
                verdict = "✔" if got[1] else "✘"
        lines.append(f"| {row.target} | {cells[0]} | {cells[1]} | {verdict} |")
    lines.append(END)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="figures.sh output files")
    parser.add_argument("--doc", type=Path, default=DOC, help="the document holding the table")
    args = parser.parse_args()
    text = args.doc.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        sys.exit(f"{args.doc} has no {BEGIN} ... {END} markers")
    names = [run.name for run in args.runs]
    source = names[0] if len(names) == 1 else f"the median of {len(names)} runs: {', '.join(names)}"
    figures = parse(*(run.read_text() for run in args.runs))
    args.doc.write_text(text[:start] + table(figures, source) + text[end + len(END) :])
    print(f"{args.doc}: the figures table now holds {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
