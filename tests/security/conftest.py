"""The hostile-guest suite: each test is an attack made from inside a real sandbox, as
guest root or as guest ``user``, and asserts that it fails and that the host is unharmed.
The local runtime's session fixtures (tests/runtime/conftest.py) are shared.

Every attack made through the ``runtime`` fixture runs once per driver: ``[local]`` (the
local driver, exactly as before) and ``[gvisor]`` (the same attack from inside gVisor;
skipped where runsc is missing). A test that holds for one driver only says so, for the
other, with :func:`tests.security.drivers.only_on` or an xfail naming the hole."""

from __future__ import annotations

import pytest

from e2bfacade.runtime.local import LocalRuntime
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
def runtime(request: pytest.FixtureRequest) -> LocalRuntime:
    """The runtime the attacks go through: the local driver's session runtime, then the
    gvisor driver's (tests/runtime/conftest.py makes, and tears down, both)."""
    rt: LocalRuntime = request.getfixturevalue(f"{request.param}_runtime")
    return rt
