"""The Code Interpreter's execution service: what ``e2b-code-interpreter``'s ``run_code``
and its contexts talk to on port 49999 inside a ``code-interpreter-v1`` sandbox.

It runs as ``user`` inside the sandbox, with the template's own Python (a virtual
environment under /opt/e2b-code-interpreter), and talks to Jupyter kernels through
jupyter_client; HTTP is tornado's (both come with ipykernel). One kernel per context; one
execution at a time per context, in arrival order.

The wire (docs/code-interpreter.md, "The service"):

* ``POST /execute`` ``{"code", "context_id"?, "language"?, "env_vars"?}``: 200 and one JSON
  object per line: ``number_of_executions``, ``stdout``/``stderr``, ``result``, ``error``,
  ``keepalive`` after 5 s of silence, then ``end_of_execution`` (always last). A client that
  hangs up interrupts the kernel.
* ``GET|POST /contexts``, ``DELETE /contexts/<id>``, ``POST /contexts/<id>/restart``.
* ``GET /health``: ``OK`` once the default Python kernel answers.

The kernels, their contexts and the sandbox's environment variables are e2b_kernels.py's,
beside this file.

This file is not imported by the control plane: it is copied into the template's image.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

from e2b_kernels import DEFAULT_CWD, Context, Contexts, Output, RequestError, normalize_language
from tornado import httpserver, iostream, web

log = logging.getLogger("e2b-execution")

PORT = int(os.environ.get("E2B_EXECUTION_PORT", "49999"))

CONTEXTS = Contexts()


class Base(web.RequestHandler):
    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(
            exc.log_message if isinstance(exc, web.HTTPError) and exc.log_message else self._reason
        )

    def fail(self, exc: RequestError) -> None:
        self.set_status(exc.status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(exc.message)

    def body_json(self) -> dict[str, Any]:
        if not self.request.body:
            return {}
        try:
            data = json.loads(self.request.body)
        except ValueError:
            raise RequestError(400, "the request body is not JSON") from None
        if not isinstance(data, dict):
            raise RequestError(400, "the request body must be a JSON object")
        return data

    def send_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))


class Health(Base):
    def get(self) -> None:
        self.send_json("OK")


class ContextList(Base):
    def get(self) -> None:
        self.send_json(CONTEXTS.listed())

    async def post(self) -> None:
        try:
            body = self.body_json()
            language = normalize_language(_optional_str(body, "language"))
            cwd = _optional_str(body, "cwd") or DEFAULT_CWD
            ctx = await CONTEXTS.create(language, cwd)
        except RequestError as exc:
            return self.fail(exc)
        self.send_json(ctx.describe())


class ContextOne(Base):
    async def delete(self, ctx_id: str) -> None:
        try:
            await CONTEXTS.remove(ctx_id)
        except RequestError as exc:
            return self.fail(exc)
        self.send_json(None)


class ContextRestart(Base):
    async def post(self, ctx_id: str) -> None:
        try:
            ctx = CONTEXTS.get(ctx_id)
        except RequestError as exc:
            return self.fail(exc)
        try:
            await ctx.restart()
        except Exception as exc:
            log.exception("context %s did not restart", ctx_id)
            return self.fail(RequestError(500, f"Failed to restart context {ctx_id}: {exc}"))
        self.send_json(None)


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise RequestError(400, f"{name} must be a string")
    return value


class Execute(Base, Output):
    gone = False

    def on_connection_close(self) -> None:
        self.gone = True

    async def emit(self, item: dict[str, Any]) -> None:
        if self.gone:
            return
        self.write(json.dumps(item) + "\n")
        try:
            await self.flush()
        except iostream.StreamClosedError:
            self.gone = True

    async def post(self) -> None:
        try:
            body = self.body_json()
            code = body.get("code")
            if not isinstance(code, str):
                raise RequestError(422, "code must be a string")
            context_id = _optional_str(body, "context_id")
            language = _optional_str(body, "language")
            if context_id and language:
                raise RequestError(400, "Only one of context_id or language can be provided")
            env_vars = body.get("env_vars") or {}
            if not isinstance(env_vars, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()
            ):
                raise RequestError(422, "env_vars must be an object of strings")
            if context_id:
                ctx = CONTEXTS.get(context_id)
            else:
                ctx = await CONTEXTS.default_for(normalize_language(language))
        except RequestError as exc:
            return self.fail(exc)
        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Cache-Control", "no-cache")
        async with ctx.lock:
            await self.run(ctx, code, env_vars)
        await self.emit({"type": "end_of_execution"})
        if not self.gone:
            self.finish()

    async def run(self, ctx: Context, code: str, env_vars: dict[str, str]) -> None:
        await ctx.revive()
        await ctx.sync_env()
        saved: dict[str, str | None] = {}
        if env_vars:
            current = {**os.environ, **ctx.env_applied}
            saved = {k: current.get(k) for k in env_vars}
            await ctx.set_env(dict(env_vars))
        await ctx.execute(code, self)
        if saved:
            await ctx.set_env(saved)


def application() -> web.Application:
    return web.Application(
        [
            (r"/health", Health),
            (r"/execute", Execute),
            (r"/contexts", ContextList),
            (r"/contexts/([^/]+)", ContextOne),
            (r"/contexts/([^/]+)/restart", ContextRestart),
        ]
    )


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # The default Python kernel answers before the port opens: whoever finds the port open
    # (the runtime's readiness check, a warm pool's claim) finds a kernel ready.
    await asyncio.gather(CONTEXTS.default_for("python"), CONTEXTS.default_for("javascript"))
    server = httpserver.HTTPServer(application(), idle_connection_timeout=3600)
    server.listen(PORT, address="0.0.0.0")
    log.info("listening on %d", PORT)
    await asyncio.Event().wait()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
