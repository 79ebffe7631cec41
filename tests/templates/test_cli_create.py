"""``e2b template create`` (E2B's CLI, ``@e2b/cli``) of a directory with an
``e2b.Dockerfile``, against a server whose builds pull from the loopback registry: the CLI
parses the Dockerfile client-side into ``fromImage`` plus steps (a Dockerfile cannot name
a template as its base), so the build always pulls an image."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.test_cli_templates import cli
from tests.support.live_server import LiveServer, ServerError, live_server, suite_database_url

# No quoted ENV value: the CLI's Dockerfile parser (e2b 2.51.0's) sends ENV A="b c" as the
# value '"b' (client-side, before any request).
DOCKERFILE = """\
FROM e2bdev/base
ENV GREETING=hello-from-the-cli
COPY hello.txt /home/user/hello.txt
RUN cat /home/user/hello.txt > /home/user/copy.txt
WORKDIR /home/user
"""


@pytest.fixture(scope="module")
def mirrored_server(registry_url: str) -> Iterator[LiveServer]:
    """A live server whose builds pull their images from the loopback registry."""
    try:
        with live_server(
            suite_database_url(), extra_env={"TEMPLATE_REGISTRY_MIRROR": registry_url}
        ) as server:
            yield server
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_cli_template_create_builds_a_dockerfile_and_a_sandbox_starts_from_it(
    mirrored_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b import Sandbox

    for var, value in (
        ("E2B_API_URL", mirrored_server.url),
        ("E2B_SANDBOX_URL", mirrored_server.sandbox_url),
        ("E2B_API_KEY", mirrored_server.api_key),
    ):
        monkeypatch.setenv(var, value)

    (tmp_path / "e2b.Dockerfile").write_text(DOCKERFILE)
    (tmp_path / "hello.txt").write_text("hello\n")
    name = f"cli-create-{uuid.uuid4().hex[:8]}"
    out = cli(
        mirrored_server,
        "template",
        "create",
        name,
        "-p",
        str(tmp_path),
        "--cpu-count",
        "1",
        "--memory-mb",
        "1024",
        "-c",
        "echo started > /tmp/started && sleep 600",
        "--ready-cmd",
        "test -f /tmp/started",
        cwd=tmp_path,
    )
    assert "finished" in out, out
    sandbox = Sandbox.create(name, timeout=120)
    try:
        assert sandbox.files.read("/home/user/copy.txt") == "hello\n"
        assert sandbox.commands.run('echo "$GREETING"').stdout == "hello-from-the-cli\n"
        assert sandbox.commands.run("cat /tmp/started").stdout == "started\n"
    finally:
        sandbox.kill()
