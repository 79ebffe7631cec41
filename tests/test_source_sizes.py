"""No hand-written source file over MAX_LINES lines. A file that long holds more than one
concern; it is split along its seams into modules named after them, as the layout in
docs/ARCHITECTURE.md names every file by what it does.

The files are git's (``git ls-files``): Python, C and C headers, wherever they sit, tests
and bench included. Generated files are left out: Django's migrations (``makemigrations``
writes them, and no one reads them as code).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600
PATTERNS = ("*.py", "*.c", "*.h")


def _generated(relative: Path) -> bool:
    return "migrations" in relative.parts


def _hand_written_sources() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *PATTERNS],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    paths = [Path(name) for name in listed.split("\0") if name]
    return [p for p in paths if not _generated(p) and (ROOT / p).is_file()]


def test_the_check_sees_the_python_and_the_c_of_the_repository() -> None:
    """Guards the check below against an empty list (git finding nothing passes it)."""
    sources = set(_hand_written_sources())
    assert Path("manage.py") in sources
    assert Path("e2bfacade/runtime/local/launcher/c/launch.c") in sources
    assert Path("e2bfacade/runtime/local/launcher/c/launcher.h") in sources
    assert Path("tests/test_source_sizes.py") in sources
    assert not any(_generated(p) for p in sources)


def test_no_hand_written_source_file_is_over_600_lines() -> None:
    too_long = {}
    for relative in _hand_written_sources():
        lines = len((ROOT / relative).read_bytes().splitlines())
        if lines > MAX_LINES:
            too_long[str(relative)] = lines
    assert too_long == {}, f"over {MAX_LINES} lines (split each along its seams): {too_long}"


# The local driver's module is its wiring and lifecycle only (docs/ARCHITECTURE.md, "The
# local driver"): what it does lives in the parts it wires, so it stays short.
DRIVER = Path("e2bfacade/runtime/local/driver.py")
DRIVER_MAX_LINES = 400


def test_the_local_driver_module_stays_wiring_and_lifecycle() -> None:
    lines = len((ROOT / DRIVER).read_bytes().splitlines())
    assert lines <= DRIVER_MAX_LINES, f"{DRIVER} is {lines} lines: move a part out of it"
