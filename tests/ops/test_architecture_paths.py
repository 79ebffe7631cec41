"""Every file docs/ARCHITECTURE.md names exists, so the map does not drift from the tree.

A name is a backticked ``path/like/this.py`` (or ``.c``, ``.h``, ``.sh``, ``.mjs``), or a
directory ``like/this/``. It is taken from the repository's root, or, inside a section
whose heading names a directory (``### The local driver (`e2bfacade/runtime/local/`)``),
from that directory. A bare file name (``views.py``) is checked only inside such a
section: elsewhere it names a convention (every app's ``views.py``), not one file. A ``*``
matches as a glob.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
NAME = re.compile(r"`([\w.*-]+(?:/[\w.*-]+)*(?:\.(?:py|c|h|sh|mjs)|/))`")
HEADING = re.compile(r"#{1,6}\s")
BASE = re.compile(r"`([\w.-]+(?:/[\w.-]+)*/)`")


def named_paths() -> list[tuple[int, str, Path | None]]:
    """(line, name, the section's base directory) for every name the page holds."""
    found: list[tuple[int, str, Path | None]] = []
    base: Path | None = None
    fenced = False
    for number, line in enumerate(ARCHITECTURE.read_text().splitlines(), start=1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if HEADING.match(line):
            match = BASE.search(line)
            base = REPO / match.group(1) if match else None
            continue
        found.extend((number, m.group(1), base) for m in NAME.finditer(line))
    return found


def exists(name: str, base: Path | None) -> bool:
    roots = [REPO] + ([base] if base is not None else [])
    for root in roots:
        if "*" in name:
            if any(root.glob(name)):
                return True
        elif (root / name).exists():
            return True
    return False


def test_every_path_the_architecture_page_names_exists() -> None:
    found = named_paths()
    checked = [(n, name, base) for n, name, base in found if "/" in name or base is not None]
    missing = [
        f"docs/ARCHITECTURE.md:{n}: `{name}`" + (f" (in {base.relative_to(REPO)}/)" if base else "")
        for n, name, base in checked
        if not exists(name, base)
    ]
    assert not missing, "no such file:\n" + "\n".join(missing)
    # The page names its runtime's files; a pattern that matched nothing would pass above.
    names = {name for _, name, _ in checked}
    assert {"sandboxes/transitions.py", "storage/images.py", "launcher/c/init.c"} <= names
