"""The request body parser: JSON as E2B's Go server reads it, with documented limits.

- at most ``MAX_BODY_BYTES`` (1 MiB) — 413 beyond;
- at most ``MAX_DEPTH`` (32) levels of nesting — 400 beyond (Python's decoder would
  otherwise recurse until it fails with an unhandled RecursionError, a 500);
- duplicate object keys are refused (400) instead of silently keeping the last one;
- NaN and Infinity are refused (not JSON), invalid UTF-8 is refused.
"""

from __future__ import annotations

import codecs
import json
from typing import IO, Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.parsers import JSONParser

MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
MAX_DEPTH = 32


class PayloadTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = f"request body exceeds the limit of {MAX_BODY_BYTES} bytes"
    default_code = "payload_too_large"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _depth(value: Any) -> int:
    """Nesting depth, iteratively (the point is not to recurse on hostile input)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(node, dict):
            stack.extend((v, level + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, level + 1) for v in node)
    return deepest


class StrictJSONParser(JSONParser):
    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Any = None
    ) -> Any:
        raw = stream.read(MAX_BODY_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_BODY_BYTES:
            raise PayloadTooLarge()
        try:
            text = codecs.decode(raw, "utf-8")
            data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
        except RecursionError:
            raise exceptions.ParseError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
            raise exceptions.ParseError(f"malformed JSON: {exc}") from None
        if _depth(data) > MAX_DEPTH:
            raise exceptions.ParseError(f"JSON nested deeper than {MAX_DEPTH} levels")
        return data
