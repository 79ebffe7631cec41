"""gunicorn settings, read automatically when gunicorn starts from the repository root
(``scripts/serve.sh``, the test suite's live servers). Flags on the command line win."""

import os

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:3000")
workers = int(os.environ.get("WEB_CONCURRENCY", "4"))
# Sandbox operations are short (milliseconds) but a create may wait briefly for another
# request with the same Idempotency-Key: keep the timeout well above IDEMPOTENCY_WAIT_SECONDS.
timeout = 60
graceful_timeout = 30
# No request-line limit: gunicorn's own 414 page is HTML, and the E2B SDKs need every error
# in {code, message}. Django answers an oversized path with a JSON 404 instead. Put a proxy
# with its own limits in front of a public deployment.
limit_request_line = 0
# Let workers finish in-flight requests on SIGTERM; recycle them now and then to bound leaks.
max_requests = 10000
max_requests_jitter = 1000
