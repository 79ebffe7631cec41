"""bench/readme_table.py: the README's table of targets is built from a figures run's
FIGURE lines alone, a missing figure is said to be missing, and only the text between the
markers changes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import readme_table

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
    readme = tmp_path / "README.md"
    readme.write_text(
        "before\n<!-- figures:begin (old) -->\n| stale |\n<!-- figures:end -->\nafter\n"
    )
    run = tmp_path / "figures-x.txt"
    run.write_text(RUN)
    text = readme_table.table(readme_table.parse(run.read_text()), run.name)
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

    monkeypatch.setattr(sys, "argv", ["readme_table.py", str(run), "--readme", str(readme)])
    assert readme_table.main() == 0
    written = readme.read_text()
    assert written.startswith("before\n<!-- figures:begin (written by bench/readme_table.py")
    assert written.endswith("<!-- figures:end -->\nafter\n")
    assert "stale" not in written and written.count("figures:begin") == 1


def test_several_runs_give_each_figure_its_median() -> None:
    runs = [f"FIGURE pg.reconcile.1000.tick_p50 {v}\n" for v in ("17", "25", "19")]
    runs.append("FIGURE sqlite.reconcile.1000.tick_p50 30\n")  # a run with another figure
    figures = readme_table.parse(*runs)
    assert figures == {"pg.reconcile.1000.tick_p50": 19.0, "sqlite.reconcile.1000.tick_p50": 30.0}
    row = next(r for r in readme_table.table(figures, "x").splitlines() if "reconcile" in r)
    assert "19.0 ms" in row and "30.0 ms" in row and row.endswith("| ✔ |")
