"""bench/perf_table.py: docs/performance.md's table of targets is built from a figures run's
FIGURE lines alone, a missing figure is said to be missing, only the text between the
markers changes, and the committed table is what the committed runs it names give."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from bench import perf_table

RUN = """
## python bench/create_floor_bench.py --n 60
FIGURE pg.create.cold.ratio 2.1
FIGURE pg.create.cold.sdk_p50 26.9
FIGURE pg.create.cold.floor 12.8
FIGURE pg.keyed.ratio 1.12
FIGURE pg.keyed.keyed_p50 33.6
FIGURE pg.keyed.unkeyed_p50 30
FIGURE sqlite.reconcile.1000.tick_p50 17
FIGURE pg.replay.floor_p50 7.1
some other line FIGURE pg.replay.p50 1
"""


def test_the_table_holds_the_runs_figures_and_says_which_are_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text("before\n<!-- figures:begin (old) -->\n| stale |\n<!-- figures:end -->\nafter\n")
    run = tmp_path / "figures-x.txt"
    run.write_text(RUN)
    text = perf_table.table(perf_table.parse(run.read_text()), run.name)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()[3:-1]}
    assert "2.10× (26.9 ÷ 12.8 ms)" in rows["SDK create ÷ its floor, cold: ≤ 3×"]
    assert rows["SDK create ÷ its floor, cold: ≤ 3×"].endswith("| ✔ |")
    assert "1.120 (33.6 ÷ 30.0 ms)" in rows["keyed ÷ unkeyed SDK create: ≤ 1.10"]
    assert rows["keyed ÷ unkeyed SDK create: ≤ 1.10"].endswith("| ✘ |")
    # Only whole FIGURE lines count, and nothing missing is carried over or invented.
    replay = rows["replay of a keyed create, p50: ≤ 3 ms"]
    assert replay.count("not measured in this run") == 2 and replay.endswith("|  |")
    assert "17.0 ms" in rows["reconcile tick at 1 000 sandboxes, p50: ≤ 20 ms"]
    assert "(PostgreSQL only)" in rows["v1 list at 10 000 live (8 572 running), p50: ≤ 50 ms"]

    monkeypatch.setattr(sys, "argv", ["perf_table.py", str(run), "--doc", str(doc)])
    assert perf_table.main() == 0
    written = doc.read_text()
    assert written.startswith("before\n<!-- figures:begin (written by bench/perf_table.py")
    assert written.endswith("<!-- figures:end -->\nafter\n")
    assert "stale" not in written and written.count("figures:begin") == 1


def test_several_runs_give_each_figure_its_median() -> None:
    runs = [f"FIGURE pg.reconcile.1000.tick_p50 {v}\n" for v in ("17", "25", "19")]
    runs.append("FIGURE sqlite.reconcile.1000.tick_p50 30\n")  # a run with another figure
    figures = perf_table.parse(*runs)
    assert figures == {"pg.reconcile.1000.tick_p50": 19.0, "sqlite.reconcile.1000.tick_p50": 30.0}
    row = next(r for r in perf_table.table(figures, "x").splitlines() if "reconcile" in r)
    assert "19.0 ms" in row and "30.0 ms" in row and row.endswith("| ✔ |")


def test_the_committed_table_is_what_the_committed_runs_it_names_give() -> None:
    # The table in docs/performance.md names the runs it was written from; those runs are
    # committed beside the scripts, so writing the table again from them changes nothing.
    text = perf_table.DOC.read_text()
    start, end = text.index(perf_table.BEGIN), text.index(perf_table.END)
    begin_line = text[start : text.index("\n", start)]
    match = re.search(r"from (?:the median of \d+ runs: )?(.+?); do not edit", begin_line)
    assert match, begin_line
    names = match.group(1).split(", ")
    runs = [perf_table.DOC.parents[1] / "bench" / name for name in names]
    assert all(run.is_file() for run in runs), runs
    figures = perf_table.parse(*(run.read_text() for run in runs))
    assert figures, "the runs hold no FIGURE line"
    source = names[0] if len(names) == 1 else f"the median of {len(names)} runs: {match.group(1)}"
    assert text[start : end + len(perf_table.END)] == perf_table.table(figures, source)
