"""The hostile-guest suite: each test is an attack made from inside a real sandbox, as
guest root or as guest ``user``, and asserts that it fails and that the host is unharmed.
The local runtime's session fixtures (tests/runtime/conftest.py) are shared."""

from __future__ import annotations

from tests.runtime.conftest import (  # noqa: F401 - fixtures
    host_scratch,
    new_sandbox_id,
    runtime,
    sandbox_id,
    static_probe,
)
