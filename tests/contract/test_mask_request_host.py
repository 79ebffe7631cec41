"""E2B's ``maskRequestHost`` through the unmodified Python SDK against the live server, as
E2B's own ``test_mask_request_host`` checks it: a server in the sandbox records the
headers of a request made from outside through the data plane, and its Host header is the
mask, ``${PORT}`` replaced by the port."""

from __future__ import annotations

import httpx
from e2b import Sandbox, SandboxNetworkOpts

from tests.support.live_server import LiveServer
from tests.support.waiting import eventually

PORT = 8080
CAPTURE = f"""python3 -c "
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open('/tmp/headers.txt', 'w') as f:
            for k, v in self.headers.items():
                f.write(k + ': ' + v + chr(10))
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(('', {PORT}), H).handle_request()
" """


def test_mask_request_host_is_the_host_header_a_sandbox_port_receives(envd_env: LiveServer) -> None:
    sbx = Sandbox.create(
        network=SandboxNetworkOpts(mask_request_host="custom-host.example.com:${PORT}"),
        timeout=60,
    )
    try:
        sbx.commands.run(CAPTURE, background=True)
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(PORT)}
        eventually(
            lambda: httpx.get(envd_env.sandbox_url, headers={**headers, "Host": "caller.example"}),
            until=lambda got: got.status_code == 200,
            within=20,
            every=0.1,
            what="the capturing server answering",
        )
        captured = sbx.commands.run("cat /tmp/headers.txt").stdout
        assert f"Host: custom-host.example.com:{PORT}" in captured, captured
        assert "caller.example" not in captured
    finally:
        sbx.kill()
