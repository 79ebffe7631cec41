"""Which driver a ``runtime`` of this suite is, and how a test says that an attack's
property holds, or does not apply, on one driver only (conftest.py parametrizes them)."""

from __future__ import annotations

import pytest

from e2bfacade.runtime.local import HostRuntime


def is_gvisor(rt: HostRuntime) -> bool:
    return rt.name == "gvisor"


def only_on(rt: HostRuntime, driver: str, why: str) -> None:
    """Skip the running test unless ``rt`` is ``driver``'s; ``why``: what the other
    driver holds instead, or why the property does not apply to it."""
    if rt.name != driver:
        pytest.skip(f"{rt.name}: {why}")


def xfail_on_gvisor(reason: str) -> pytest.MarkDecorator:
    """A ``runtime`` parametrization for a test that shows a hole of the gvisor driver:
    strict, so the suite says when it is closed."""
    return pytest.mark.parametrize(
        "runtime",
        [
            pytest.param("local"),
            pytest.param("gvisor", marks=pytest.mark.xfail(strict=True, reason=reason)),
        ],
        indirect=True,
    )
