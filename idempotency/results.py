"""What a keyed request answers, and what is stored to replay it.

A :class:`Result` is the exact bytes of an answer (status, body, content type, headers): the
claim algorithm stores it encrypted on the record, and a replay gives it back byte for byte
with ``Idempotent-Replayed: true``. Separate from both the algorithm
(``idempotency/claims.py``) and the HTTP edge (``idempotency/http.py``) because both speak
it: keeping the value type below them lets the edge import the algorithm, never the reverse.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from rest_framework.renderers import JSONRenderer

from e2bfacade import crypto
from e2bfacade.errors import ApiError, error_body
from idempotency.models import IdempotencyRecord

logger = logging.getLogger(__name__)
CONTENT_TYPE = "application/json"
REPLAY_HEADER = "Idempotent-Replayed"


@dataclass(frozen=True)
class Result:
    status: int
    body: bytes
    content_type: str = CONTENT_TYPE
    replayed: bool = False
    headers: tuple[tuple[str, str], ...] = ()

    def to_response(self) -> HttpResponse:
        response = HttpResponse(self.body, status=self.status, content_type=self.content_type)
        if self.replayed:
            response[REPLAY_HEADER] = "true"
        for name, value in self.headers:
            response[name] = value
        return response


def render(payload: Any) -> bytes:
    return JSONRenderer().render(payload)


def error_result(exc: ApiError) -> Result:
    return Result(
        exc.status,
        render(error_body(exc.status, exc.message, exc.error_code)),
        headers=tuple(exc.headers.items()),
    )


def stored_result(record: IdempotencyRecord) -> Result:
    """The completed record's stored answer, as a replay (caller checked it is completed).
    A body no configured key can open (its key was dropped, or SECRET_KEY changed under a
    derived key) answers 503 ``idempotency_record_unreadable``: an operator's fault, said
    as such, never a 500 and never a second execution."""
    assert record.response_status is not None and record.response_body_encrypted is not None
    try:
        body = crypto.decrypt(record.response_body_encrypted)
    except ImproperlyConfigured:
        logger.error(
            "idempotency: record %s cannot be decrypted with the configured keys", record.pk
        )
        return error_result(
            ApiError(
                "the stored answer for this Idempotency-Key cannot be decrypted: its key is no "
                "longer in IDEMPOTENCY_ENCRYPTION_KEYS; retry with a new key",
                status=503,
                error_code="idempotency_record_unreadable",
                headers={"Should-Retry": "false"},
            )
        )
    return Result(record.response_status, body, record.response_content_type, replayed=True)
