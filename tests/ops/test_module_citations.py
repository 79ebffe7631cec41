"""Every module path the code, the tests and the docs name exists: a comment or a doc that
cites ``sandboxes/hosts.py`` or ``runtime/local/warm.py`` after the file moved or never was
is a map that lies. So does a docstring's ``:func:`` that names what is not there, or a doc
naming a test that is not there: both are checked below (the headings a citation names are
tests/ops/test_doc_citations.py's).

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

import ast
import re
from functools import cache
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


@cache  # one walk of the tree for every test here
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


# ------------------------------------------------------------------ names in docstrings
# A Sphinx role naming a module or a name of this repository: ``:mod:`sandboxes.worker```,
# ``:func:`nodes.selectors.local_node```, ``:class:`.streams.Share``` (relative to the
# citing module's package), or a bare ``:func:`error_body``` (the citing module's own, or
# one it imports).
ROLE = re.compile(r":(mod|func|class|meth|data|attr|exc|obj):`~?([.\w]+)`")
PACKAGES = {"bench", "e2bfacade", "idempotency", "nodes", "sandboxes", "snapshots", "templates"}
PACKAGES |= {"scripts", "tests"}
# Citations inside e2bfacade/runtime that do not resolve where they stand (none left: the
# runtime's refactor resolved them). An entry must still occur (the test fails on one that
# does not, so the list only shrinks).
PENDING_IN_RUNTIME: set[tuple[str, str]] = set()


@cache
def defined_names(path: Path) -> frozenset[str]:
    """Every name a module defines or imports, at any depth (a method counts: a bare
    ``:meth:`` names one of the class it is written in)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def module_file(parts: list[str]) -> Path | None:
    path = REPO.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return path / "__init__.py" if (path / "__init__.py").is_file() else None


def role_resolves(target: str, citing: Path) -> bool:
    """Whether ``target`` names a module of this repository, or a name one defines."""
    if target.startswith("."):
        level = len(target) - len(target.lstrip("."))
        package = list(citing.relative_to(REPO).parent.parts)
        parts = package[: len(package) - (level - 1)] + target.lstrip(".").split(".")
    elif target.split(".")[0] in PACKAGES:
        parts = target.split(".")
    else:
        # The citing module's own name (``Class.method`` by its class).
        return target.split(".")[0] in defined_names(citing)
    for i in range(len(parts), 0, -1):
        found = module_file(parts[:i])
        if found is not None:
            return i == len(parts) or parts[i] in defined_names(found)
    return False


def test_every_name_a_docstring_cites_is_defined() -> None:
    missing, pending, seen = [], set(), 0
    for path in scanned_files():
        if path.suffix != ".py" or path == Path(__file__).resolve():
            continue
        relative = str(path.relative_to(REPO))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in ROLE.finditer(line):
                seen += 1
                if role_resolves(match.group(2), path):
                    continue
                if (relative, match.group(0)) in PENDING_IN_RUNTIME:
                    pending.add((relative, match.group(0)))
                else:
                    missing.append(f"{relative}:{number}: {match.group(0)}")
    assert not missing, "cited, not defined there:\n" + "\n".join(missing)
    assert pending == PENDING_IN_RUNTIME, f"resolved now, drop: {PENDING_IN_RUNTIME - pending}"
    assert seen > 150  # the pattern finds the tree's many roles


def test_the_role_check_tells_a_name_that_is_there_from_one_that_is_not() -> None:
    here = REPO / "sandboxes" / "worker.py"
    assert role_resolves("sandboxes.worker", here)
    assert role_resolves("nodes.selectors.local_node", here)
    assert role_resolves(".transitions", here)  # sandboxes.transitions
    assert role_resolves("sandbox_expire", here)
    assert not role_resolves("sandboxes.hosts", here)
    assert not role_resolves("nodes.selectors.no_such_name", here)
    assert not role_resolves(".no_such_module", here)
    assert not role_resolves("error_response", REPO / "e2bfacade" / "errors.py")


# ------------------------------------------------------------------------ named tests
# ``tests/x/test_y.py::test_z`` anywhere, and, in the docs, a bare ``test_…`` word: a test
# module's name or a test's. docs/compatibility.md names E2B's SDK suites' tests, not ours.
NODE_ID = re.compile(r"((?:[\w.-]+/)*test_\w+\.py)::(\w+)")
TEST_WORD = re.compile(r"(?<![\w./-])(test_[a-z0-9_]+)\b(?![./])")
UPSTREAM_TESTS_DOC = REPO / "docs" / "compatibility.md"
TEST_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+((?:test_|Test)\w*)", re.M)


def our_test_names() -> set[str]:
    """Our test modules' names, and every test function and class defined under tests/."""
    names: set[str] = set()
    for path in (REPO / "tests").rglob("*.py"):
        names.add(path.stem)
        names.update(m.group(1) for m in TEST_DEF.finditer(path.read_text()))
    return names


def test_every_test_the_code_and_docs_name_exists() -> None:
    known = our_test_names()
    missing, seen = [], set()
    for path in scanned_files():
        if path == Path(__file__).resolve() or path == REPO / "CHANGELOG.md":
            continue
        words = path.suffix == ".md" and path != UPSTREAM_TESTS_DOC
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            for match in NODE_ID.finditer(line):
                seen.add(match.group(0))
                if match.group(1) in NOT_OURS:
                    continue
                candidates = [r / match.group(1) for r in (REPO, *path.parents)]
                target = next((c for c in candidates if c.is_file()), None)
                if target is None or match.group(2) not in defined_names(target):
                    missing.append(f"{where}: {match.group(0)}")
            if words:
                for word in TEST_WORD.finditer(line):
                    seen.add(word.group(1))
                    if word.group(1) not in known:
                        missing.append(f"{where}: {word.group(1)}")
    assert not missing, "no such test:\n" + "\n".join(missing)
    # The patterns find the citations the docs are known to make (networking.md's test).
    cited = "test_while_no_egress_proxy_listens_an_egress_proxy_sandbox_reaches_nothing"
    assert {f"tests/network/test_egress.py::{cited}", cited} <= seen


def test_the_test_check_tells_a_test_that_is_there_from_one_that_is_not() -> None:
    known = our_test_names()
    assert {"test_egress", "test_every_name_a_docstring_cites_is_defined"} <= known
    assert "test_cwd_r" not in known  # E2B's, named by docs/compatibility.md
    text = "`tests/api/test_nodes.py::test_gone` and test_nodes, not tests/test_x.py"
    assert [m.group(0) for m in NODE_ID.finditer(text)] == ["tests/api/test_nodes.py::test_gone"]
    assert [m.group(1) for m in TEST_WORD.finditer(text)] == ["test_gone", "test_nodes"]
