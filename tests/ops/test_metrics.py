"""/metrics: Prometheus text with request counts and latencies per route pattern, sandboxes
by state (read from the database at scrape time), runtime operation latencies and the
idempotency counters. The suite runs without PROMETHEUS_MULTIPROC_DIR, so it reads this
process's registry; counters are cumulative across tests, so each test compares before and
after."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from e2bfacade.runtime.base import ProcessSpec
from e2bfacade.runtime.guest import run_process
from e2bfacade.runtime.local import LocalRuntime
from idempotency.maintenance import purge_expired
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox
from tests.support.factories import SandboxFactory, TeamFactory

pytestmark = [pytest.mark.both_databases, pytest.mark.django_db]


def scrape(client: APIClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def sample(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: dict[Any, float], after: dict[Any, float], name: str, **labels: str) -> float:
    return sample(after, name, **labels) - sample(before, name, **labels)


def test_metrics_needs_no_api_key_and_is_prometheus_text(anonymous_client: APIClient) -> None:
    response = anonymous_client.get("/metrics")

    assert response.status_code == 200
    assert "# TYPE e2bfacade_http_requests_total counter" in response.content.decode()


def test_requests_are_counted_per_route_pattern_not_per_path(
    anonymous_client: APIClient, api_client: APIClient
) -> None:
    before = scrape(anonymous_client)

    for sandbox_id in ("inope1", "inope2", "inope3"):
        assert api_client.get(f"/sandboxes/{sandbox_id}").status_code == 404
    api_client.get("/no/such/route")
    after = scrape(anonymous_client)

    route = "/sandboxes/<str:sandbox_id>"
    counted = {"method": "GET", "route": route, "status": "404"}
    timed = {"method": "GET", "route": route}
    assert delta(before, after, "e2bfacade_http_requests_total", **counted) == 3
    assert delta(before, after, "e2bfacade_http_request_duration_seconds_count", **timed) == 3
    unmatched = {"method": "GET", "route": "(unmatched)", "status": "404"}
    assert sample(after, "e2bfacade_http_requests_total", **unmatched) >= 1
    # No raw path ever becomes a label value.
    assert not any("inope" in str(key) for key in after)


def test_sandboxes_by_state_counts_rows_at_scrape_time(anonymous_client: APIClient) -> None:
    SandboxFactory.create_batch(2, state=Sandbox.State.RUNNING)
    SandboxFactory.create(state=Sandbox.State.PAUSED)

    samples = scrape(anonymous_client)

    assert sample(samples, "e2bfacade_sandboxes_by_state", state="running") == 2
    assert sample(samples, "e2bfacade_sandboxes_by_state", state="paused") == 1
    # Every state is reported, zeros included, so a series never disappears.
    for state in Sandbox.State:
        assert ("e2bfacade_sandboxes_by_state", (("state", state.value),)) in samples


def test_the_drivers_capabilities_are_reported_so_an_operator_sees_which_keeps_memory(
    anonymous_client: APIClient, settings: Any
) -> None:
    for driver, memory in (("local", 0), ("gvisor", 1)):
        settings.SANDBOX_RUNTIME = driver
        samples = scrape(anonymous_client)
        name = "e2bfacade_runtime_capability"
        assert sample(samples, name, driver=driver, capability="memory_snapshots") == memory
        assert sample(samples, name, driver=driver, capability="filesystem_pause") == 1


def test_a_scrape_is_one_query_per_table(
    anonymous_client: APIClient, django_assert_num_queries: Any
) -> None:
    SandboxFactory.create_batch(3)

    # One GROUP BY for the sandboxes by state, one for the volumes by state.
    with django_assert_num_queries(2):
        anonymous_client.get("/metrics")


def test_runtime_operations_and_idempotency_decisions_are_counted(
    anonymous_client: APIClient,
    api_client: APIClient,
    create_sandbox: Callable[..., Any],
    runtime: LocalRuntime,
) -> None:
    before = scrape(anonymous_client)

    first = create_sandbox(key="metrics-key-1")
    replay = create_sandbox(key="metrics-key-1")
    mismatch = create_sandbox(key="metrics-key-1", timeout=61)
    assert (first.status_code, replay.status_code, mismatch.status_code) == (201, 201, 409)
    assert api_client.delete(f"/sandboxes/{first.json()['sandboxID']}").status_code == 204
    after = scrape(anonymous_client)

    events = "e2bfacade_idempotency_events_total"
    assert delta(before, after, events, event="executed") == 1
    assert delta(before, after, events, event="replay") == 1
    assert delta(before, after, events, event="mismatch") == 1
    runtime_ops = "e2bfacade_runtime_operation_seconds_count"
    assert delta(before, after, runtime_ops, op="create", outcome="ok") == 1
    assert delta(before, after, runtime_ops, op="kill", outcome="ok") == 1
    # Operations call status() inside: only the outermost operation is timed.
    assert delta(before, after, runtime_ops, op="status", outcome="ok") == 0


def test_a_guests_operations_are_counted_under_their_own_names(
    anonymous_client: APIClient, create_sandbox: Callable[..., Any], runtime: LocalRuntime
) -> None:
    sandbox_id = create_sandbox().json()["sandboxID"]
    before = scrape(anonymous_client)

    guest = runtime.guest(sandbox_id)  # the data plane's one resolution per request
    guest.write_file("/tmp/counted", [b"x"])
    assert b"".join(guest.read_file("/tmp/counted")) == b"x"
    assert run_process(guest, ProcessSpec(("true",))).exit_code == 0
    after = scrape(anonymous_client)

    runtime_ops = "e2bfacade_runtime_operation_seconds_count"
    for op in ("guest", "write_file", "read_file", "start_process"):
        assert delta(before, after, runtime_ops, op=op, outcome="ok") == 1, op
    assert delta(before, after, runtime_ops, op="status", outcome="ok") == 0


def test_idempotency_purges_are_counted(anonymous_client: APIClient) -> None:
    team = TeamFactory.create()
    past = timezone.now() - timedelta(days=2)
    for n in range(3):
        IdempotencyRecord.objects.create(
            team=team,
            key=f"old-{n}",
            route="POST /v2/sandboxes",
            fingerprint="v1:x",
            state=IdempotencyRecord.State.COMPLETED,
            lease_expires_at=past,
            resource_id=f"iold{n}",
            request_encrypted=b"",
            created_at=past,
            expires_at=past + timedelta(days=1),
        )
    before = sample(scrape(anonymous_client), "e2bfacade_idempotency_purged_records_total")

    assert purge_expired() == 3

    after = sample(scrape(anonymous_client), "e2bfacade_idempotency_purged_records_total")
    assert after - before == 3


def test_metric_names_follow_prometheus_conventions(anonymous_client: APIClient) -> None:
    text = anonymous_client.get("/metrics").content.decode()
    ours = set(re.findall(r"^# TYPE (e2bfacade_\S+) (\w+)$", text, re.MULTILINE))

    assert ("e2bfacade_http_requests_total", "counter") in ours
    assert ("e2bfacade_http_request_duration_seconds", "histogram") in ours
    assert ("e2bfacade_runtime_operation_seconds", "histogram") in ours
    assert ("e2bfacade_sandboxes_by_state", "gauge") in ours
