"""Citations of the documentation hold: a heading that code, tests or docs cite exists in the
file they cite, and a link between the docs leads to a file and a heading that exist.

A citation is a document's name followed by a heading in double quotes, with an optional
comma between them:

    docs/idempotency.md, "Retry table"        docs/ARCHITECTURE.md "Routes"
    README "Two commands"                      runtime.md "Admission"  (inside docs/)

The document is ``README`` / ``README.md`` / ``CHANGELOG.md`` at the root, ``ARCHITECTURE``
(docs/ARCHITECTURE.md), ``docs/<name>.md``, or a bare ``<name>.md`` (next to the citing file,
else in docs/). The heading is a Markdown ``#`` heading of that file, outside code blocks;
it may run over a line break (comment markers at the start of the next line are dropped),
and a heading that ends in a parenthesis ("The local driver (`e2bfacade/runtime/local/`)")
may be cited without it.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SCANNED = {".py", ".c", ".h", ".sh", ".md", ".mjs", ".js", ".toml"}
SKIPPED_DIRS = {".venv", ".git", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}

CITATION = re.compile(
    r"(?<![\w/.\-\"'])(?P<doc>README(?:\.md)?|CHANGELOG\.md|ARCHITECTURE(?:\.md)?"
    r"|docs/[A-Za-z][\w-]*\.md|[a-z][\w-]*\.md)"
    r"(?:,?[ \t]+|,|,?[ \t]*\n[ \t]*(?:#|//|\*)?[ \t]*)"
    r"\"(?P<heading>[A-Z`][^\"\n]*(?:\n[^\"\n]+)?)\""
)
LINK = re.compile(r"\]\((?P<target>[^)\s#]*\.md)?(?:#(?P<anchor>[^)\s]+))?\)")
CONTINUATION = re.compile(r"\n[ \t]*(?:#|//|\*)?[ \t]*")


def scanned_files() -> list[Path]:
    files = []
    for path in REPO.rglob("*"):
        if path.suffix in SCANNED and path.is_file():
            # This file names the pattern's forms as examples, not as citations.
            if path != Path(__file__).resolve() and not SKIPPED_DIRS.intersection(
                path.relative_to(REPO).parts
            ):
                files.append(path)
    return sorted(files)


def headings(doc: Path) -> list[str]:
    found, fenced = [], False
    for line in doc.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6}\s+(.+?)\s*#*$", line)):
            found.append(match.group(1))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in headings(doc):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def resolve(doc: str, citing: Path) -> Path:
    if doc in ("README", "README.md", "CHANGELOG.md"):
        return REPO / ("CHANGELOG.md" if doc.startswith("CHANGELOG") else "README.md")
    if doc.startswith("ARCHITECTURE"):
        return DOCS / "ARCHITECTURE.md"
    if doc.startswith("docs/"):
        return REPO / doc
    beside = citing.parent / doc
    return beside if beside.exists() else DOCS / doc


def cites(heading: str, cited: str) -> bool:
    return heading == cited or (heading.startswith(cited + " (") and heading.endswith(")"))


def citations() -> list[tuple[Path, int, Path, str]]:
    found = []
    for path in scanned_files():
        text = path.read_text(errors="replace")
        for match in CITATION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            heading = CONTINUATION.sub(" ", match.group("heading")).strip()
            found.append((path, line, resolve(match.group("doc"), path), heading))
    return found


def test_every_cited_heading_exists_in_the_file_it_is_cited_from() -> None:
    found = citations()
    broken = []
    for path, line, doc, heading in found:
        where = f"{path.relative_to(REPO)}:{line}"
        if not doc.is_file():
            broken.append(f'{where}: {doc.relative_to(REPO)} "{heading}": no such file')
        elif not any(cites(h, heading) for h in headings(doc)):
            broken.append(f'{where}: {doc.relative_to(REPO)} has no heading "{heading}"')
    assert not broken, "\n".join(broken)
    # The pattern finds the citations the code is known to make, so an empty scan (or a
    # pattern that silently stopped matching) cannot pass.
    cited = {(doc.name, heading) for _, _, doc, heading in found}
    assert ("idempotency.md", "Retry table") in cited
    assert ("ARCHITECTURE.md", "Claim, act, finish") in cited


def test_every_link_between_the_docs_leads_to_a_file_and_heading_that_exist() -> None:
    broken = []
    docs = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
    for path in docs:
        text = path.read_text()
        for match in LINK.finditer(text):
            target, anchor = match.group("target"), match.group("anchor")
            if target is None and anchor is None:
                continue
            doc = (path.parent / target).resolve() if target else path
            where = f"{path.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}"
            if not doc.is_file():
                broken.append(f"{where}: {target}: no such file")
            elif anchor is not None and anchor not in anchors(doc):
                broken.append(f"{where}: {doc.relative_to(REPO)} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_citation_pattern_reads_the_forms_it_documents(tmp_path: Path) -> None:
    text = (
        'see docs/idempotency.md, "Retry table" and README "Two commands";\n'
        '# (docs/ARCHITECTURE.md, "The local\n# driver") and runtime.md "Admission"\n'
        'not a citation: path.md" or "quoted"\n'
    )
    got = [
        (m.group("doc"), CONTINUATION.sub(" ", m.group("heading"))) for m in CITATION.finditer(text)
    ]
    assert got == [
        ("docs/idempotency.md", "Retry table"),
        ("README", "Two commands"),
        ("docs/ARCHITECTURE.md", "The local driver"),
        ("runtime.md", "Admission"),
    ]
    assert slug("The hot path's targets") == "the-hot-paths-targets"
    assert slug("`domain` and where the SDK sends sandbox traffic") == (
        "domain-and-where-the-sdk-sends-sandbox-traffic"
    )
    assert cites("The local driver (`e2bfacade/runtime/local/`)", "The local driver")
    assert not cites("The local driver (`e2bfacade/runtime/local/`)", "The local")
