"""What a keyed request answers, and what is stored to replay it.

A :class:`Result` is the exact bytes of an answer (status, body, content type, headers): the
claim algorithm stores it encrypted on the record, and a replay gives it back byte for byte
with ``Idempotent-Replayed: true``. Separate from both the algorithm
(``idempotency/claims.py``) and the HTTP edge (``idempotency/http.py``) because both speak
it: keeping the value type below them lets the edge import the algorithm, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpResponse
from rest_framework.renderers import JSONRenderer

from e2bfacade.errors import ApiError, error_body
from idempotency import crypto
from idempotency.models import IdempotencyRecord

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
    """The completed record's stored answer, as a replay (caller checked it is completed)."""
    assert record.response_status is not None and record.response_body_encrypted is not None
    return Result(
        record.response_status,
        crypto.decrypt(record.response_body_encrypted),
        record.response_content_type,
        replayed=True,
    )
