"""The WSGI application, as gunicorn serves it (``e2bfacade.wsgi:application``)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable
from typing import Any

from django.core.wsgi import get_wsgi_application

from e2bfacade.startup import refuse_insecure_secrets

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e2bfacade.settings")

# No serving on a public SECRET_KEY: the worker fails to boot and gunicorn exits, naming it.
refuse_insecure_secrets()
django_application = get_wsgi_application()

from django.conf import settings  # noqa: E402  (after the settings module is chosen)


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Django reads exactly CONTENT_LENGTH bytes of a body, so one sent chunked (no
    Content-Length) would arrive empty — and Node's fetch, which the JS SDK uses, sends every
    body that way. The server has already de-chunked it (``wsgi.input_terminated``): read it
    here, one byte past the body limit so that an oversized one still gets its 413."""
    if environ.get("wsgi.input_terminated") and not environ.get("CONTENT_LENGTH"):
        body = environ["wsgi.input"].read(settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
        if body:
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
    return django_application(environ, start_response)
