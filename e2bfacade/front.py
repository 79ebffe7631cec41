"""The API's front: nginx between the clients and gunicorn, as ``manage.py serve`` runs it.

gunicorn's sync workers serve one connection each, from its first byte to its last: two
clients that send half a request and wait hold two workers until gunicorn's timeout, and
a few hundred hold every worker of every replica. nginx reads each request whole (request
line, headers and body, every one bounded in size and time) on one event loop before it
hands it to gunicorn, and buffers the answer for a client that reads slowly, so a worker
only ever meets a complete request and never waits on a client. gunicorn then listens on a
unix socket in the front's directory, reachable by nginx's workers and the service's user
alone; nginx listens on ``--bind``.

One path is not gunicorn's: ``PUT /templates/uploads/...`` (the Template SDK's COPY
archives, up to a GiB each) goes to the data plane, unbuffered. There the upload URL is
checked and the body's size reserved before any of it is read, and the body streams to its
place on an event loop, bounded in time (sandboxes/dataplane/template_uploads.py): spooled
here first, anyone could fill the host's disk with bodies under forged URLs, and streamed
through a sync worker, a slow sender would hold that worker.

What nginx itself answers (a request line or header too long, a body over the limit, a
client too slow, gunicorn down) is in E2B's error shape, ``{"code": ..., "message": ...}``,
as the SDKs expect of every error (:func:`_errors`). Everything gunicorn answers passes
through unchanged.
"""

from __future__ import annotations

import glob
import grp
import json
import os
import pwd
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

# nginx's limits, the contract a client meets. One header line (the request line included)
# fits in LINE_BYTES; all of them, in HEADER_BUFFERS buffers of that size.
LINE_BYTES = 8192
HEADER_BUFFERS = 4
# A client must send its headers within this, and each part of its body within this of the
# one before (a body trickled in holds nginx's memory, never a gunicorn worker).
CLIENT_SECONDS = 10
# Above gunicorn's timeout (60 s, gunicorn.conf.py), so that a slow create is gunicorn's to
# end, never cut here first.
UPSTREAM_SECONDS = 75
# On a stop nginx finishes the requests it has in hand, within STOP_SECONDS of serve.
SHUTDOWN_SECONDS = 40
# One event loop carries thousands of idle connections; the workers are gunicorn's.
WORKER_CONNECTIONS = 4096
# The account nginx's workers run as when serve runs as root (they parse what clients send).
WORKER_USER = "nobody"

_PREFIX = "e2bfacade-front-"
SOCKET_NAME = "api.sock"
# Where nginx's own errors are rendered: internal, and no route of the API.
ERROR_PATH = "/_front/error/"
CONF_NAME = "nginx.conf"


def _errors(body_limit: int) -> dict[int, tuple[int, str]]:
    """nginx's own error statuses: what each becomes (status, message)."""
    return {
        400: (400, "bad request: the request line or a header is malformed"),
        # nginx's "request header too large", sent as a 400.
        494: (
            400,
            f"request header too large: each header line must fit in {LINE_BYTES} bytes, "
            f"all of them in {LINE_BYTES * HEADER_BUFFERS}",
        ),
        404: (404, "not found"),  # a request for one of the internal locations below
        405: (405, "method not allowed"),
        408: (408, f"request timeout: a request must be sent within {CLIENT_SECONDS} s"),
        411: (411, "length required"),
        413: (413, f"request body exceeds the limit of {body_limit} bytes"),
        414: (414, f"request line too long: it must fit in {LINE_BYTES} bytes"),
        500: (500, "internal server error in the front; the failure has been logged"),
        501: (501, "not implemented: unsupported transfer encoding"),
        502: (502, "the API is unavailable (restarting or overloaded); retry shortly"),
        504: (504, f"the API did not answer within {UPSTREAM_SECONDS} s"),
    }


# Statuses a client may retry after a moment (the SDKs honour Retry-After).
_RETRY = {502}


def nginx_binary() -> str | None:
    """nginx's path, also where a non-root PATH lacks the sbin directories."""
    path = os.environ.get("PATH", os.defpath) + os.pathsep + "/usr/sbin:/sbin"
    return shutil.which("nginx", path=path)


@dataclass(frozen=True)
class Front:
    """One front's directory: its configuration, nginx's pid file and temporary files, and
    the unix socket gunicorn listens on. :func:`make` creates it; :meth:`remove` removes it."""

    directory: Path

    @property
    def socket(self) -> Path:
        return self.directory / SOCKET_NAME

    @property
    def conf(self) -> Path:
        return self.directory / CONF_NAME

    def command(self, nginx: str) -> list[str]:
        # -e: errors on stderr from the very start (before the configuration is read);
        # -p: relative paths (pid file, temporary files) are the front's directory's.
        return [
            nginx, "-e", "stderr", "-p", f"{self.directory}/", "-c", str(self.conf),
            "-g", "daemon off;",
        ]  # fmt: skip

    def gunicorn_args(self) -> list[str]:
        """gunicorn's listener and limits behind this front. nginx bounds the request line
        and headers (gunicorn's own answer to a breach is an HTML page): gunicorn takes
        whatever nginx passed."""
        return ["--bind", f"unix:{self.socket}"] + [
            "--limit-request-line",
            "0",
            "--limit-request-fields",
            "32768",  # gunicorn's maximum; 32 kB of headers hold fewer lines than this
            "--limit-request-field_size",
            "0",
        ]

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def make(
    host: str,
    port: int,
    body_limit: int,
    *,
    uploads: tuple[str, int],
    upload_limit: int,
    upload_seconds: int,
) -> Front:
    """A fresh front directory for ``host:port``, with its nginx configuration.

    It is private to this process's user, except that when running as root nginx's workers
    (:data:`WORKER_USER`) may walk in to reach the socket and their temporary files (the
    master makes those and hands them over). Directories of earlier fronts whose process
    is gone (a serve killed with SIGKILL) are removed first: the pid is in the name."""
    for stale in glob.glob(os.path.join(tempfile.gettempdir(), _PREFIX + "*-*")):
        pid = os.path.basename(stale)[len(_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(stale, ignore_errors=True)
    directory = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
    worker = None
    if os.geteuid() == 0:
        account = pwd.getpwnam(WORKER_USER)
        worker = (account.pw_name, grp.getgrgid(account.pw_gid).gr_name)
        os.chown(directory, 0, account.pw_gid)
        os.chmod(directory, 0o710)
    front = Front(directory)
    front.conf.write_text(
        config(
            front,
            host,
            port,
            body_limit,
            worker,
            uploads=uploads,
            upload_limit=upload_limit,
            upload_seconds=upload_seconds,
        )
    )
    return front


def _quoted(text: str) -> str:
    """``text`` as a single-quoted nginx string, where ``$`` would start a variable."""
    if any(c in text for c in "'\\$"):
        raise ValueError(f"not a literal nginx string: {text!r}")
    return f"'{text}'"


def _upstream(host: str, port: int) -> str:
    """Where to reach a server listening on ``host:port`` from this host."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(host, host)
    return _listen(host, port)


def _listen(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def config(
    front: Front,
    host: str,
    port: int,
    body_limit: int,
    worker: tuple[str, str] | None,
    *,
    uploads: tuple[str, int],
    upload_limit: int,
    upload_seconds: int,
) -> str:
    """nginx's configuration for a front on ``host:port`` passing to ``front.socket``;
    ``uploads``: the data plane's address, where template file uploads go unbuffered, with
    their body limit (``upload_limit``, TEMPLATE_FILE_MAX_MB) and their deadline
    (``upload_seconds``, TEMPLATE_UPLOAD_SECONDS, the data plane's to enforce)."""
    errors = _errors(body_limit)
    pages = []
    locations = []
    for status, (answer, message) in errors.items():
        body = json.dumps({"code": answer, "message": message}, separators=(",", ":"))
        # A URI, not a named location: nginx cannot redirect a request whose line it could
        # not parse (414, 400) to a named one.
        pages.append(f"        error_page {status} {ERROR_PATH}{status};")
        retry = "            add_header Retry-After 1 always;\n" if answer in _RETRY else ""
        locations.append(
            f"        location = {ERROR_PATH}{status} {{\n"
            f"            internal;\n"
            f"            default_type application/json;\n{retry}"
            f"            return {answer} {_quoted(body)};\n"
            f"        }}"
        )
    user = f"user {worker[0]} {worker[1]};\n" if worker else ""
    page_lines = "\n".join(pages)
    location_lines = "\n".join(locations)
    return f"""\
# Written by manage.py serve (e2bfacade/front.py) for this start; rewritten on the next.
{user}worker_processes 1;
pid nginx.pid;
error_log stderr warn;
worker_rlimit_nofile {WORKER_CONNECTIONS * 2 + 64};
worker_shutdown_timeout {SHUTDOWN_SECONDS}s;

events {{
    worker_connections {WORKER_CONNECTIONS};
}}

http {{
    # Every request already gets one JSON line from the API (e2bfacade/observability.py).
    access_log off;
    server_tokens off;
    client_body_temp_path client_body;
    proxy_temp_path proxy;
    fastcgi_temp_path fastcgi;
    uwsgi_temp_path uwsgi;
    scgi_temp_path scgi;

    # A request is read whole, within bounds, before gunicorn sees any of it.
    client_header_timeout {CLIENT_SECONDS}s;
    client_body_timeout {CLIENT_SECONDS}s;
    large_client_header_buffers {HEADER_BUFFERS} {LINE_BYTES // 1024}k;
    # DATA_UPLOAD_MAX_MEMORY_SIZE: the same limit as the API's own.
    client_max_body_size {body_limit};
    reset_timedout_connection on;

    # A request without Host (HTTP/1.0) reaches the API with the address it was sent to,
    # as gunicorn listening there would have named it.
    map $http_host $api_host {{
        "" {_quoted(_listen(host, port))};
        default $http_host;
    }}

    server {{
        listen {_listen(host, port)} backlog=2048;
        server_name _;

        # Template file uploads: to the data plane, as they arrive (never spooled here).
        # It answers a refused URL before reading the body, and ends a slow one itself.
        location /templates/uploads/ {{
            client_max_body_size {max(upload_limit, body_limit)};
            proxy_pass http://{_upstream(*uploads)};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $api_host;
            proxy_request_buffering off;
            proxy_send_timeout {upload_seconds + UPSTREAM_SECONDS}s;
            proxy_read_timeout {upload_seconds + UPSTREAM_SECONDS}s;
            proxy_intercept_errors off;
        }}

        location / {{
            proxy_pass http://unix:{front.socket}:;
            # The client's Host, port included, as the API saw it without a front (the
            # admin's CSRF check compares a form's Origin with it).
            proxy_set_header Host $api_host;
            proxy_request_buffering on;
            proxy_buffering on;
            proxy_read_timeout {UPSTREAM_SECONDS}s;
            # gunicorn's answers, errors included, are the API's: passed as they are.
            proxy_intercept_errors off;
        }}

{page_lines}

{location_lines}
    }}
}}
"""
