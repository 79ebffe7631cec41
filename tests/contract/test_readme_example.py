"""The README's E2B SDK example runs as written against a live server, through the SDK and
the data plane, as a user pasting it after ``serve.sh``'s exports would run it."""

from __future__ import annotations

import contextlib
import io
import re

import httpx

from tests.support.live_server import REPO, LiveServer


def readme_example() -> str:
    blocks: list[str] = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return next(block for block in blocks if block.startswith("from e2b import Sandbox\n"))


def test_the_readme_sdk_example_runs_as_written(envd_env: LiveServer) -> None:
    code = readme_example()
    key = re.search(r'idempotency_key="([^"]+)"', code)
    assert key, "the example shows the Idempotency-Key"
    out = io.StringIO()
    scope: dict[str, object] = {}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own text
    assert re.fullmatch(r"hello from \S+\n+", out.getvalue()), out.getvalue()
    # The example ends with a kill: the sandbox it made is gone, not left running.
    sandbox_id = scope["sbx"].sandbox_id  # type: ignore[attr-defined]
    got = httpx.get(
        f"{envd_env.url}/sandboxes/{sandbox_id}", headers={"X-API-Key": envd_env.api_key}
    )
    assert got.status_code == 404, got.text
