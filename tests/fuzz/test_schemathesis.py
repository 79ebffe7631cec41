"""schemathesis against a live server, every operation of its OpenAPI schema
(``/openapi.json``, drf-spectacular): schema-valid and schema-invalid requests, with random
ids and with the ids of real sandboxes. For every answer: no 5xx; every 4xx in E2B's error
shape (JSON, ``code`` equal to the status, a string ``message``); every answer conforms to
the schema's description of its status.

Bounded: ``EXAMPLES`` per operation and generation mode, no shrinking, no example
database, so it finishes in about a minute. The sandboxes it makes are killed at the end.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.support import live_checks as lc
from tests.support.live_fixtures import started
from tests.support.live_server import LiveServer

EXAMPLES = 25
# Short-lived sandboxes: what the fuzzer creates cannot outlive the test by much.
MAX_TIMEOUT = 300
REAL_SANDBOXES = 3


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with started(API_RATE_LIMIT="0", SANDBOX_MAX_TIMEOUT_SECONDS=str(MAX_TIMEOUT)) as live:
        yield live


def shape_problem(response: schemathesis.Response) -> str | None:
    """Why an error answer is not in E2B's shape, or None."""
    if response.status_code < 400:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        return f"non-JSON body {response.content[:200]!r}"
    if not isinstance(body, dict) or body.get("code") != response.status_code:
        return f"body without code == {response.status_code}: {body!r:.200}"
    if not isinstance(body.get("message"), str):
        return f"body without a string message: {body!r:.200}"
    return None


@schemathesis.check
def e2b_error_shape(ctx: Any, response: schemathesis.Response, case: Case[Any]) -> None:
    problem = shape_problem(response)
    if problem is not None:
        raise AssertionError(f"error not in E2B's shape: {problem}")


CHECKS = [not_a_server_error, e2b_error_shape, response_schema_conformance]


def real_sandboxes(http: httpx.Client, pool: list[str]) -> list[str]:
    """Top the pool up to REAL_SANDBOXES live sandboxes (the fuzzer kills some)."""
    live = lc.api_live(http)
    pool[:] = [s for s in pool if s in live]
    while len(pool) < REAL_SANDBOXES:
        response = http.post("/v2/sandboxes", json={"templateID": "base", "timeout": MAX_TIMEOUT})
        assert response.status_code == 201, response.text
        pool.append(response.json()["sandboxID"])
    return pool


def with_base_template(case: Case[Any]) -> Case[Any]:
    """A create body naming the real ``base`` template, so that valid bodies make sandboxes."""
    if isinstance(case.body, dict):
        case.body["templateID"] = "base"
    return case


def strategies_for(
    operation: Any, http: httpx.Client, pool: list[str]
) -> list[st.SearchStrategy[Case[Any]]]:
    """Schema-valid and schema-invalid requests, plus valid ones aimed at things that exist:
    real sandboxes, the ``base`` template, create bodies naming ``base``."""
    strategies = [
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    ]
    real: list[dict[str, str]] = []
    if "{sandboxID}" in operation.path:
        real = [{"sandboxID": sandbox_id} for sandbox_id in real_sandboxes(http, pool)]
    elif "{templateID}" in operation.path:
        real = [{"templateID": "base"}]
    elif "{alias}" in operation.path:
        real = [{"alias": "base"}]
    for params in real:
        strategies.append(operation.as_strategy(GenerationMode.POSITIVE, path_parameters=params))
    if operation.method.upper() == "POST" and operation.path in ("/v2/sandboxes", "/sandboxes"):
        strategies.append(operation.as_strategy(GenerationMode.POSITIVE).map(with_base_template))
    return strategies


def fuzz_operation(
    server: LiveServer, strategies: list[st.SearchStrategy[Case[Any]]], seen: Counter[int]
) -> None:
    headers = {"X-API-Key": server.api_key}

    @hypothesis.settings(
        max_examples=EXAMPLES * 2,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=st.one_of(strategies))
    def fuzz(case: Case[Any]) -> None:
        response = case.call(base_url=server.url, headers=headers, timeout=30)
        seen[response.status_code] += 1
        case.validate_response(response, checks=CHECKS, headers=headers)

    fuzz()


def test_every_operation_survives_schemathesis_with_answers_in_e2b_shape(
    server: LiveServer,
) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 20, [op.label for op in operations]
    failures: dict[str, str] = {}
    seen: dict[str, Counter[int]] = {}
    pool: list[str] = []
    with lc.client(server) as http:
        for operation in operations:
            strategies = strategies_for(operation, http, pool)
            try:
                fuzz_operation(server, strategies, seen.setdefault(operation.label, Counter()))
            except (Exception, BaseExceptionGroup) as exc:  # one failure must not hide others
                failures[operation.label] = str(exc)[:3000]
        # Kill what the fuzzer made (and the pool), so nothing piles up.
        for sandbox_id in lc.api_live(http):
            assert http.delete(f"/sandboxes/{sandbox_id}").status_code in (204, 404)

    for label, counts in seen.items():
        print(f"{label}: {dict(sorted(counts.items()))}")
    assert failures == {}, "\n\n".join(f"== {k}\n{v}" for k, v in failures.items())
    assert lc.access_log_5xx(server.log_path) == []
