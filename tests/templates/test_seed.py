"""Seeding a registry with the Debian bases, from the cache: the names pushed, the Ubuntu
substitution said as one, and a clear error when the cache lacks a base offline."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from templates.builds import debian
from tests.support.registry import loopback_registry


def test_seeding_pushes_every_name_and_says_the_ubuntu_name_is_a_substitution() -> None:
    said: list[str] = []
    with tempfile.TemporaryDirectory(prefix="e2bt-registry-") as storage:
        with loopback_registry(Path(storage)) as url:
            try:
                seeded = debian.seed(
                    url,
                    cache_dir=settings.TEMPLATE_CACHE_DIR / "bases",
                    offline=True,
                    ubuntu_substitute=True,
                    log=said.append,
                )
            except debian.BaseNotCached as exc:
                pytest.skip(exc.message)
    assert [(s.name, s.recipe, s.substitute) for s in seeded] == [
        ("library/debian:bookworm", "debian-bookworm", False),
        ("library/debian:12", "debian-bookworm", False),
        ("library/ubuntu:22.04", "debian-bookworm", True),
        ("e2bdev/base:latest", "e2b-base", False),
    ]
    substitution = [line for line in said if line.startswith("SUBSTITUTION:")]
    assert substitution == [
        "SUBSTITUTION: library/ubuntu:22.04 is pushed as Debian bookworm "
        "(recipe debian-bookworm); nothing of it is Ubuntu"
    ]


def test_offline_a_base_missing_from_the_cache_names_the_command_that_builds_it(
    tmp_path: Path,
) -> None:
    with pytest.raises(debian.BaseNotCached) as caught:
        debian.seed("http://127.0.0.1:9", cache_dir=tmp_path, offline=True)
    assert "is not cached in" in caught.value.message
    assert "manage.py seed_registry --build-only" in caught.value.message
    assert not list(tmp_path.glob("*.tar"))
