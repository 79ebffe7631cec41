"""``code-interpreter-v1`` is cached by the digest of its inputs: a change to any of them
(requirements, npm lock, a guest file, ``/etc/R``) is a new digest, so a new build; the same
inputs, the same digest, so no build."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from templates.code_interpreter import template


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Copies of the template's inputs, in place of the real ones."""
    shutil.copy(template.REQUIREMENTS, tmp_path / "requirements.txt")
    for path in template.NODE_PACKAGES:
        shutil.copy(path, tmp_path)
    shutil.copytree(template.GUEST_FILES, tmp_path / "guest")
    (tmp_path / "R").mkdir()
    (tmp_path / "R/Renviron").write_text("R_LIBS_USER=x\n")
    monkeypatch.setattr(template, "REQUIREMENTS", tmp_path / "requirements.txt")
    monkeypatch.setattr(
        template, "NODE_PACKAGES", (tmp_path / "package.json", tmp_path / "package-lock.json")
    )
    monkeypatch.setattr(template, "GUEST_FILES", tmp_path / "guest")
    monkeypatch.setattr(template, "R_CONFIG", tmp_path / "R")
    return tmp_path


@pytest.mark.parametrize(
    "changed",
    ["requirements.txt", "package-lock.json", "guest/e2b_kernels.py", "R/Renviron"],
)
def test_changing_any_input_of_the_code_interpreter_changes_its_digest(
    inputs: Path, changed: str
) -> None:
    before = template.inputs_digest()
    assert template.inputs_digest() == before
    with open(inputs / changed, "a") as f:
        f.write("\n# changed\n")
    assert template.inputs_digest() != before
