"""Request equivalence, as E2B defines it, versioned.

Two requests are the same request when their method, path, query and canonical body match.
The canonical body is built by the route's serializer: validated, schema defaults filled in
for scalars, unknown fields and nulls dropped. So key order, whitespace, unknown fields,
``null`` vs absent and an omitted field vs its explicit default are all equivalent, while a
changed value, a different array order, or ``{}`` vs an absent object are different.

A record stores ``<version>:<digest>`` and is always compared with the version it was
written under, so changing the canonical form (add "v2" below) never breaks live keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

CURRENT_VERSION = "v1"


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _v1(
    method: str, path: str, query: Iterable[tuple[str, list[str]]], body: dict[str, Any]
) -> str:
    canonical = {
        "method": method.upper(),
        "path": path,
        "query": sorted((k, sorted(v)) for k, v in query),
        "body": _drop_nulls(body),
    }
    data = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()


VERSIONS = {"v1": _v1}


def fingerprint(
    version: str,
    *,
    method: str,
    path: str,
    query: Iterable[tuple[str, list[str]]],
    body: dict[str, Any],
) -> str:
    try:
        fn = VERSIONS[version]
    except KeyError:
        raise ValueError(f"unknown fingerprint version {version!r}") from None
    return f"{version}:{fn(method, path, list(query), body)}"
