"""R through ``e2b-code-interpreter`` against the live server: Debian's R and IRkernel in the
``code-interpreter-v1`` template, with the results, contexts, env vars, interrupts and
restarts E2B's own template gives R. IRkernel shows every value as display data, so a value
is ``results[i]``, never the execution's main result (``execution.text`` is None), on E2B
too."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable

import pytest
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox


def test_r_cells_print_keep_state_and_show_their_values(sbx: Sandbox) -> None:
    hello = sbx.run_code('print("Hello, World!")', language="r")
    assert hello.error is None and hello.logs.stdout == ['[1] "Hello, World!"\n']
    assert sbx.run_code("x <- 41", language="r").results == []
    [value] = sbx.run_code("x + 1", language="r").results
    assert value.text == "[1] 42" and value.html == "42" and not value.is_main_result
    assert sbx.run_code("getwd()", language="r").results[0].text == '[1] "/home/user"'
    frame = sbx.run_code("data.frame(name = c('a', 'b'), n = 1:2)", language="r").results[0]
    assert "<table" in frame.html and frame.text.splitlines()[0].split() == ["name", "n"]
    [plot] = sbx.run_code("plot(1:3, main = 'rises')", language="r").results
    assert base64.b64decode(plot.png)[:8] == b"\x89PNG\r\n\x1a\n"
    assert sbx.run_code("warning('careful')", language="r").logs.stderr[0].startswith("Warning")
    # R's recommended packages are there, as in E2B's template (Debian's r-base).
    assert sbx.run_code("library(MASS); nrow(Boston)", language="r").results[0].text == "[1] 506"
    failed = sbx.run_code('f <- function() stop("boom")\nf()', language="r")
    assert failed.error is not None and failed.error.name == "ERROR"
    assert failed.error.value == "Error in f(): boom\n" and "1. f()" in failed.error.traceback
    assert failed.results == []
    # The kernel, and its state, are still there; R's kernel is a context of its own.
    after = sbx.run_code("x", language="r")
    assert after.results[0].text == "[1] 41" and after.execution_count == 10
    assert "r" in {c.language for c in sbx.list_code_contexts()}
    assert sbx.run_code("x").error.name == "NameError"  # not Python's


def test_r_contexts_have_their_own_state_and_cwd(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(language="r", cwd="/tmp")
    assert ctx.language == "r" and ctx.cwd == "/tmp"
    assert sbx.run_code("getwd()", context=ctx).results[0].text == '[1] "/tmp"'
    sbx.run_code("only_here <- 1", context=ctx)
    assert sbx.run_code("exists('only_here')", language="r").results[0].text == "[1] FALSE"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    assert sbx.run_code("exists('only_here')", context=ctx).results[0].text == "[1] FALSE"
    assert sbx.run_code("getwd()", context=ctx).results[0].text == '[1] "/tmp"'
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]


def test_env_vars_reach_r_from_the_create_and_per_call(
    make_ci: Callable[..., Sandbox],
) -> None:
    sbx = make_ci(envs={"TEST_ENV_VAR": "supertest"})

    def getenv(name: str, envs: dict[str, str] | None = None) -> str:
        code = f"Sys.getenv('{name}', unset = 'unset')"
        return str(sbx.run_code(code, language="r", envs=envs).results[0].text)

    assert getenv("TEST_ENV_VAR") == '[1] "supertest"'
    assert getenv("TEST_ENV_VAR", {"TEST_ENV_VAR": "overwrite"}) == '[1] "overwrite"'
    assert getenv("TEST_ENV_VAR") == '[1] "supertest"'  # the create's value is back
    assert getenv("FOO", {"FOO": "bar"}) == '[1] "bar"'
    assert getenv("FOO") == '[1] "unset"'  # per-call values are gone again
    assert getenv("E2B_SANDBOX_ID") == f'[1] "{sbx.sandbox_id}"'
    # A value is passed as data, not code: quotes, backslashes, new lines, non-ASCII.
    odd = "q\"uo\\te é\n$HOME `x` 's"
    shown = sbx.run_code("cat(Sys.getenv('ODD'))", language="r", envs={"ODD": odd})
    assert shown.error is None and shown.logs.stdout == [odd]


def test_an_r_cell_past_its_timeout_is_interrupted_and_a_killed_r_kernel_restarts(
    sbx: Sandbox,
) -> None:
    sbx.run_code("kept <- 'yes'", language="r")
    for endless in ("Sys.sleep(60)", "repeat {}"):
        started = time.monotonic()
        with pytest.raises(TimeoutException):
            sbx.run_code(endless, language="r", timeout=1)
        assert time.monotonic() - started < 10
        # Interrupted, not killed: the same kernel answers at once.
        started = time.monotonic()
        assert sbx.run_code("kept", language="r").results[0].text == '[1] "yes"'
        assert time.monotonic() - started < 5
    died = sbx.run_code("tools::pskill(Sys.getpid(), tools::SIGKILL)", language="r", timeout=60)
    assert died.error is not None and died.error.name == "KernelDied"
    assert sbx.run_code("exists('kept')", language="r").results[0].text == "[1] FALSE"
