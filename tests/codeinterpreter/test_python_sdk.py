"""``e2b-code-interpreter`` (Python, sync and async) against the live server: the quickstart,
rich results, errors, streaming, timeouts and interrupts, contexts, languages, env vars, and
the warm pool's exactly-once claim under an Idempotency-Key."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import pytest
from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Context, Sandbox

from tests.support.live_server import LiveServer


def test_the_quickstart_keeps_state_across_calls(sbx: Sandbox) -> None:
    first = sbx.run_code("x = 41\nprint('set')")
    assert first.error is None and first.logs.stdout == ["set\n"] and first.results == []
    again = sbx.run_code("x += 1\nx")
    assert again.text == "42"
    assert again.results[0].is_main_result
    assert again.execution_count == 2


def test_a_matplotlib_figure_arrives_as_png_with_its_chart(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 1, 9])\n"
        "plt.title('rises')\n"
        "plt.show()"
    )
    assert execution.error is None
    [figure] = execution.results
    assert base64.b64decode(figure.png)[:8] == b"\x89PNG\r\n\x1a\n"
    assert not figure.is_main_result
    assert figure.chart is not None and figure.chart.title == "rises"
    assert figure.chart.type.value == "line"
    assert figure.extra == {}


def test_a_dataframe_arrives_as_html_and_data(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "import pandas as pd\npd.DataFrame({'name': ['a', 'b'], 'n': [1, None]})"
    )
    [frame] = execution.results
    assert "<table" in frame.html and "<th>name</th>" in frame.html
    assert frame.data == {"name": ["a", "b"], "n": [1.0, None]}
    assert "name" in frame.text


def test_other_result_formats(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "from IPython.display import display, Markdown, Latex, HTML, JSON\n"
        "display(Markdown('**b**'))\n"
        "display(Latex(r'$x^2$'))\n"
        "display({'k': [1, 2]})\n"
        "'a string'"
    )
    markdown, latex, json_result, text = execution.results
    assert markdown.markdown == "**b**" and latex.latex == "$x^2$"
    assert json_result.json == {"k": [1, 2]}
    assert text.text == "a string" and text.is_main_result  # a string's repr, unquoted


def test_an_exception_arrives_as_the_executions_error(sbx: Sandbox) -> None:
    execution = sbx.run_code("def f():\n    return 1 / 0\nf()")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "return 1 / 0" in execution.error.traceback
    assert "\x1b[" not in execution.error.traceback  # plain text, no terminal colours
    assert execution.results == []
    # The kernel is still there.
    assert sbx.run_code("2 * 3").text == "6"


def test_streaming_callbacks_arrive_in_order_and_as_they_happen(sbx: Sandbox) -> None:
    events: list[tuple[str, str, float]] = []
    execution = sbx.run_code(
        "import sys, time\n"
        "print('one', flush=True)\n"
        "time.sleep(0.6)\n"
        "print('two', file=sys.stderr, flush=True)\n"
        "time.sleep(0.6)\n"
        "from IPython.display import display\n"
        "display(7)\n"
        "raise ValueError('three')",
        on_stdout=lambda m: events.append(("stdout", m.line, time.monotonic())),
        on_stderr=lambda m: events.append(("stderr", m.line, time.monotonic())),
        on_result=lambda r: events.append(("result", r.text or "", time.monotonic())),
        on_error=lambda e: events.append(("error", e.value, time.monotonic())),
    )
    assert [(kind, text) for kind, text, _ in events] == [
        ("stdout", "one\n"),
        ("stderr", "two\n"),
        ("result", "7"),
        ("error", "three"),
    ]
    # Streamed, not delivered at the end: the sleeps separate them.
    assert events[1][2] - events[0][2] > 0.4 and events[2][2] - events[1][2] > 0.4
    assert execution.error is not None and execution.error.name == "ValueError"


def test_a_timeout_interrupts_the_kernel_and_keeps_its_state(sbx: Sandbox) -> None:
    sbx.run_code("kept = 'yes'")
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.run_code("import time\nwhile True: time.sleep(0.1)", timeout=1)
    assert time.monotonic() - started < 10
    # The client hung up, so the kernel was interrupted: the next call runs at once, in
    # the same kernel.
    started = time.monotonic()
    assert sbx.run_code("kept").text == "yes"
    assert time.monotonic() - started < 5


def test_contexts_create_list_restart_and_remove(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(cwd="/tmp")
    assert ctx.language == "python" and ctx.cwd == "/tmp"
    assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
    sbx.run_code("only_here = 1", context=ctx)
    failed = sbx.run_code("only_here")  # the default context does not have it
    assert failed.error is not None and failed.error.name == "NameError"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    assert sbx.run_code("only_here", context=ctx).error.name == "NameError"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=ctx)
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=Context(context_id="no-such-context", language="python", cwd="/"))


def test_languages_the_template_has_and_an_error_for_the_others(sbx: Sandbox) -> None:
    bash = sbx.run_code("echo $((6 * 7)) in $PWD", language="bash")
    assert bash.logs.stdout == ["42 in /home/user\n"]
    bash_ctx = sbx.create_code_context(language="bash", cwd="/tmp")
    assert sbx.run_code("pwd", context=bash_ctx).logs.stdout == ["/tmp\n"]
    # IPython runs "!" commands on a terminal: its line ends are \r\n, as on E2B.
    assert sbx.run_code("!echo from the shell").logs.stdout == ["from the shell\r\n"]
    with pytest.raises(SandboxException, match="not available in this template"):
        sbx.run_code('System.out.println("hi")', language="java")
    with pytest.raises(SandboxException, match="not available in this template"):
        sbx.create_code_context(language="deno")


def test_javascript_and_typescript_cells(sbx: Sandbox) -> None:
    assert {c.language for c in sbx.list_code_contexts()} >= {"python", "javascript"}
    hello = sbx.run_code("console.log('Hello'); console.error('warn')", language="js")
    assert hello.logs.stdout == ["Hello\n"] and hello.logs.stderr == ["warn\n"]
    # Declarations outlive their cell; the last expression is the result.
    sbx.run_code("const base = 40\nfunction add(n) { return base + n }", language="js")
    assert sbx.run_code("add(2)", language="js").text == "42"
    assert sbx.run_code("const base = 1; base", language="js").text == "1"  # declared again
    imported = sbx.run_code(
        "import { readFileSync } from 'fs'\nimport path from 'node:path'\n"
        "typeof readFileSync + ' ' + path.basename('/a/b.txt')",
        language="js",
    )
    assert imported.text == "function b.txt"
    waited = sbx.run_code(
        "const late = await new Promise((r) => setTimeout(() => r('later'), 50))\nlate",
        language="js",
    )
    assert waited.text == "later" and sbx.run_code("late", language="js").text == "later"
    assert sbx.run_code("({a: [1, 2]})", language="js").text == "{ a: [ 1, 2 ] }"
    failed = sbx.run_code("null.x", language="js")
    assert failed.error is not None and failed.error.name == "TypeError"
    assert "e2b_js_kernel" not in failed.error.traceback  # the cell's frames only
    typed = sbx.run_code(
        "interface P { name: string }\nconst p: P = { name: 'ts' }\np.name", language="ts"
    )
    assert typed.text == "ts"
    assert sbx.run_code("process.cwd()", language="ts").text == "/home/user"
    env = sbx.run_code("process.env.ONLY_NOW", language="js", envs={"ONLY_NOW": "yes"})
    assert env.text == "yes"
    assert sbx.run_code("process.env.ONLY_NOW ?? 'gone'", language="js").text == "gone"
    # A timeout interrupts a JavaScript cell too; its globals stay.
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) {}", language="js", timeout=1)
    assert sbx.run_code("base + 1", language="js", timeout=30).text == "2"


def test_a_kernel_that_exits_is_started_again(sbx: Sandbox) -> None:
    """As Jupyter's server does: the execution that ended it says so, the next one runs in
    a fresh kernel of the same context."""
    for language, code, state in [
        ("python", "import os; os._exit(3)", "kept = 1"),
        ("javascript", "process.exit(3)", "const kept = 1"),
    ]:
        sbx.run_code(state, language=language)
        died = sbx.run_code(code, language=language, timeout=60)
        assert died.error is not None and died.error.name == "KernelDied"
        again = sbx.run_code(
            "typeof kept" if language == "javascript" else "1 + 1", language=language
        )
        assert again.text == ("undefined" if language == "javascript" else "2")


def test_env_vars_from_the_create_and_per_call(make_ci: Callable[..., Sandbox]) -> None:
    sbx = make_ci(envs={"FROM_CREATE": "c", "SHARED": "create"})
    code = "import os; (os.environ.get('FROM_CREATE'), os.environ.get('SHARED'), "
    code += "os.environ.get('PER_CALL'), os.environ['E2B_SANDBOX_ID'])"
    expected = f"('c', 'create', None, '{sbx.sandbox_id}')"
    assert sbx.run_code(code).text == expected
    during = sbx.run_code(code, envs={"PER_CALL": "p", "SHARED": "call"})
    assert during.text == f"('c', 'call', 'p', '{sbx.sandbox_id}')"
    assert sbx.run_code(code).text == expected  # per-call values are gone again
    bash = sbx.run_code("echo $FROM_CREATE $PER_CALL", language="bash", envs={"PER_CALL": "b"})
    assert bash.logs.stdout == ["c b\n"]
    assert sbx.run_code("echo ${PER_CALL:-unset}", language="bash").logs.stdout == ["unset\n"]


def test_the_sandbox_is_a_full_sandbox_too(sbx: Sandbox) -> None:
    """commands and files work beside run_code, and see the same files."""
    sbx.run_code("open('/home/user/made.txt', 'w').write('by the kernel')")
    assert sbx.files.read("/home/user/made.txt") == "by the kernel"
    assert sbx.commands.run("python -c 'import pandas; print(pandas.__name__)'").stdout == (
        "pandas\n"
    )
    assert sbx.commands.run("whoami").stdout == "user\n"


def test_a_keyed_create_claims_one_sandbox_and_replays_it(
    ci_env: LiveServer, ci_http: httpx.Client
) -> None:
    """The warm pool under the idempotency contract: a retried keyed create answers the
    same sandbox, and only the sandboxes the team made are listed (never the pool's)."""
    tag = uuid.uuid4().hex
    body = {"templateID": "code-interpreter-v1", "metadata": {"t": tag}, "timeout": 120}
    key = {"Idempotency-Key": f"ci-{tag}"}
    first = ci_http.post("/sandboxes", json=body, headers=key)
    again = ci_http.post("/sandboxes", json=body, headers=key)
    assert first.status_code == 201, first.text
    assert again.status_code == 201 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    sandbox_id = first.json()["sandboxID"]
    try:
        listed = ci_http.get("/v2/sandboxes", params={"metadata": f"t={tag}"}).json()
        assert [s["sandboxID"] for s in listed] == [sandbox_id]
        every = ci_http.get("/v2/sandboxes", params={"limit": 100}).json()
        assert not [s for s in every if s["sandboxID"].startswith("warm-")]
        sbx = Sandbox.connect(sandbox_id)
        assert sbx.run_code("import socket; socket.gethostname()").text == sandbox_id
    finally:
        ci_http.delete(f"/sandboxes/{sandbox_id}")


def test_bad_requests_to_the_execution_service_get_clear_errors(
    sbx: Sandbox, ci_env: LiveServer
) -> None:
    """What the SDKs never send, straight through the data plane: 4xx with a message,
    never a 5xx, and the service goes on."""
    headers = {
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "E2b-Sandbox-Port": "49999",
        "X-Access-Token": sbx._envd_access_token or "",
    }
    with httpx.Client(base_url=ci_env.sandbox_url, headers=headers, timeout=30) as client:
        for body, status, said in [
            (b"{not json", 400, "not JSON"),
            (b"[1, 2]", 400, "JSON object"),
            (b'{"code": 5}', 422, "code must be a string"),
            (b'{"code": "1", "env_vars": {"A": 1}}', 422, "env_vars"),
            (b'{"code": "1", "context_id": "x", "language": "python"}', 400, "Only one of"),
            (b'{"code": "1", "context_id": "nope"}', 404, "Context nope not found"),
            (b'{"code": "1", "language": "cobol"}', 400, "unknown language"),
        ]:
            answer = client.post("/execute", content=body)
            assert answer.status_code == status and said in answer.text, (body, answer.text)
        for body, status in [(b'{"cwd": "/no/such/dir"}', 400), (b'{"language": 3}', 400)]:
            answer = client.post("/contexts", content=body)
            assert answer.status_code == status, answer.text
        assert client.delete("/contexts/nope").status_code == 404
        assert client.post("/contexts/nope/restart").status_code == 404
        assert client.get("/health").json() == "OK"
    assert sbx.run_code("'still here'").text == "still here"


def test_the_service_is_reached_by_host_name_too(sbx: Sandbox, ci_env: LiveServer) -> None:
    """Host mode, as a front proxy for ``*.<SANDBOX_DOMAIN>`` forwards it:
    ``49999-<id>.<domain>`` instead of the E2b-Sandbox-* headers."""
    host = {"Host": f"49999-{sbx.sandbox_id}.localhost"}
    with httpx.Client(base_url=ci_env.sandbox_url, headers=host, timeout=30) as client:
        assert client.get("/health").json() == "OK"
        lines = client.post(
            "/execute",
            json={"code": "6 * 7"},
            headers={"X-Access-Token": sbx._envd_access_token or ""},
        ).text.splitlines()
    assert '"text": "42"' in lines[1] and lines[-1] == '{"type": "end_of_execution"}'


def test_a_kill_during_run_code_is_an_error_not_an_empty_result(
    make_ci: Callable[..., Sandbox],
) -> None:
    sbx = make_ci()
    killer = threading.Timer(1.5, sbx.kill)
    killer.start()
    try:
        with pytest.raises(TimeoutException, match="sandbox was killed"):
            sbx.run_code("import time; time.sleep(120)", timeout=120)
    finally:
        killer.cancel()


def test_the_async_sdk(ci_env: LiveServer) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create(timeout=120)
        try:
            lines: list[str] = []
            execution = await sbx.run_code(
                "for i in range(3): print(i)\n'done'", on_stdout=lambda m: lines.append(m.line)
            )
            assert execution.text == "done" and "".join(lines) == "0\n1\n2\n"
            ctx = await sbx.create_code_context()
            assert (await sbx.run_code("1 + 1", context=ctx)).text == "2"
            with pytest.raises(TimeoutException):
                await sbx.run_code("import time; time.sleep(30)", timeout=1)
            assert (await sbx.run_code("'after'")).text == "after"
        finally:
            await sbx.kill()

    asyncio.run(main())
