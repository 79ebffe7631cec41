"""The hostile-guest suite: each test is an attack made from inside a real sandbox, as
guest root or as guest ``user``, and asserts that it fails and that the host is unharmed.
The local runtime's session fixtures (tests/runtime/conftest.py) are shared.

Every attack made through the ``runtime`` fixture runs on the local driver (``[local]``);
an attack on what crosses the sandboxer seam (marked ``sandboxer``: processes, pause and
resume, snapshots, ports, the agent's reach, escape attempts at the kernel) runs from
inside gVisor too (``[gvisor]``; skipped where runsc is missing). The rest is the host
layer both drivers share (the root's layout, its id blocks, disks sized before a launch,
records): once, on the local driver. A test that holds for one driver only says so, for
the other, with :func:`tests.security.drivers.only_on` or an xfail naming the hole."""

from __future__ import annotations

import pytest

from e2bfacade.runtime.local import HostRuntime
from tests.runtime.conftest import (  # noqa: F401 - fixtures
    gvisor_runtime,
    host_scratch,
    new_sandbox_id,
    sandbox_id,
    static_probe,
)
from tests.runtime.conftest import runtime as local_runtime  # noqa: F401 - fixture

DRIVERS = ("local", "gvisor")


@pytest.fixture(scope="session", params=DRIVERS)
def runtime(request: pytest.FixtureRequest) -> HostRuntime:
    """The runtime the attacks go through: the local driver's session runtime, then the
    gvisor driver's (tests/runtime/conftest.py makes, and tears down, both)."""
    rt: HostRuntime = request.getfixturevalue(f"{request.param}_runtime")
    return rt


@pytest.hookimpl(tryfirst=True)  # before the fixture's own params are applied
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The ``runtime`` of a test not marked ``sandboxer`` is the local driver's only (a
    module with a ``runtime`` fixture of its own, or a test that parametrizes it itself, is
    left as it is)."""
    if "runtime" not in metafunc.fixturenames or "runtime" in vars(metafunc.module):
        return
    if is_marked(metafunc, "sandboxer"):
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if "runtime" in (names.split(",") if isinstance(names, str) else names):
            return
    metafunc.definition.add_marker(pytest.mark.parametrize("runtime", ["local"], indirect=True))


def is_marked(metafunc: pytest.Metafunc, name: str) -> bool:
    """Whether the test or its module (``pytestmark``, not yet on the test's node while
    tests are generated) carries the mark ``name``."""
    module_marks = getattr(metafunc.module, "pytestmark", [])
    if not isinstance(module_marks, list):
        module_marks = [module_marks]
    return metafunc.definition.get_closest_marker(name) is not None or any(
        mark.name == name for mark in module_marks
    )
