"""Every module path the code, the tests and the docs name exists: a comment or a doc that
cites ``sandboxes/hosts.py`` or ``runtime/local/warm.py`` after the file moved or never was
is a map that lies.

A name is a path of at least two parts ending in a source suffix (``.py``, ``.c``, ``.sh``,
``.mjs``, ``.md``), outside a C ``#include``. It resolves from the repository's root, from
``docs/``, from any directory above the file that names it (``pools/warm.py`` in
``e2bfacade/runtime/local/launcher/launch.py`` is ``e2bfacade/runtime/local/pools/warm.py``),
or, in the docs, as the end of a file's path (``storage/disks.py`` in a page about the local
driver). CHANGELOG.md is history (it names files as they were) and docs/ARCHITECTURE.md's
names are tests/ops/test_architecture_paths.py's. Names of files inside a sandbox or a
template, not of this repository, are listed below.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = {".py", ".c", ".h", ".sh", ".md", ".mjs", ".js", ".toml"}
SKIPPED_DIRS = {".venv", ".git", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
NAME = re.compile(r"(?<![\w/.\-:@~$])((?:[A-Za-z_][\w.-]*/)+[\w.-]+\.(?:py|c|sh|mjs|md))(?![\w/])")
INCLUDE = re.compile(r"^\s*#\s*include\b")
# Paths of guest files, archives and examples: not this repository's.
NOT_OURS = {
    "startup/00-e2b.py",  # an IPython profile's file, inside the code-interpreter image
    "path/like/this.py",  # test_architecture_paths.py's example of a name
    "isolated_settings/settings.py",  # a settings module a test writes to a temporary dir
    "etc/profile.d/e2b-code-interpreter.sh",  # inside the code-interpreter image
    "guest/e2b_kernels.py",  # in the copy of the code-interpreter's inputs a test makes
    "env_vars/test_r.py",  # E2B's code-interpreter suite's files (docs/compatibility.md)
    "env_vars/test_java.py",
    "env_vars/test_python.py",
}


def scanned_files() -> list[Path]:
    return sorted(
        path
        for path in REPO.rglob("*")
        if path.suffix in SCANNED
        and path.is_file()
        and not SKIPPED_DIRS.intersection(path.relative_to(REPO).parts)
    )


def resolves(name: str, citing: Path, tails: set[str]) -> bool:
    roots = [REPO, REPO / "docs", *citing.parents]
    if any((root / name).exists() for root in roots if REPO in (root, *root.parents)):
        return True
    return citing.suffix == ".md" and name in tails


def path_tails(files: list[Path]) -> set[str]:
    """Every trailing part of every file's path: ``a/b/c.py`` gives ``b/c.py`` and ``c.py``."""
    tails: set[str] = set()
    for path in files:
        parts = path.relative_to(REPO).parts
        tails.update("/".join(parts[i:]) for i in range(len(parts)))
    return tails


def test_every_module_path_named_in_code_tests_and_docs_exists() -> None:
    missing = []
    seen = 0
    files = scanned_files()
    tails = path_tails(files)
    skipped = {
        Path(__file__).resolve(),
        REPO / "CHANGELOG.md",
        REPO / "docs/ARCHITECTURE.md",
        REPO / "tests/ops/test_architecture_paths.py",  # the page's names, as its test
    }
    for path in files:
        if path in skipped:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if INCLUDE.match(line):
                continue
            for match in NAME.finditer(line):
                name = match.group(1)
                seen += 1
                if name not in NOT_OURS and not resolves(name, path, tails):
                    missing.append(f"{path.relative_to(REPO)}:{number}: {name}")
    assert not missing, "no such file:\n" + "\n".join(missing)
    assert seen > 200  # the pattern finds the tree's many citations
