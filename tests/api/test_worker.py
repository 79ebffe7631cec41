"""The lifecycle worker (``manage.py run_worker``) against real sandboxes: timeouts, abandoned
transitions, reconciliation, and two workers at once."""

from __future__ import annotations

import logging
import signal
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from e2bfacade.runtime.base import SandboxSpec, SandboxState
from e2bfacade.runtime.local import LocalRuntime
from sandboxes.management.commands.run_worker import Command
from sandboxes.models import Sandbox
from tests.api.helpers import postgres_only, run_at_once, runtime_state
from tests.support.factories import SandboxFactory

pytestmark = pytest.mark.both_databases

CreateSandbox = Callable[..., dict[str, Any]]
State = Sandbox.State
LONG_AGO = timedelta(hours=1)


def row(sandbox_id: str) -> Sandbox:
    return Sandbox.objects.get(pk=sandbox_id)


@pytest.fixture
def worker_log(
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> pytest.LogCaptureFixture:
    """The worker's log. A tick swallows its exceptions (it retries next tick), so each
    test also checks that no tick failed."""
    caplog.set_level(logging.INFO, logger="e2bfacade.worker")
    marker = request.node.get_closest_marker("django_db")
    if not (marker and marker.kwargs.get("transaction")):
        # Each tick starts with close_old_connections(), which closes a connection inside a
        # transaction: that is the test's own (Django's test client unhooks it likewise).
        # The transactional test at the end of this module runs it for real.
        monkeypatch.setattr(
            "sandboxes.management.commands.run_worker.close_old_connections", lambda: None
        )
    return caplog


def run_once(log: pytest.LogCaptureFixture, *args: str) -> None:
    # The command installs SIGTERM/SIGINT handlers for its loop; put pytest's back after.
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        call_command("run_worker", "--once", *args)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    failures = [r for r in log.records if "tick failed" in r.getMessage()]
    assert not failures, failures[0].exc_text


def expire(sandbox_id: str) -> None:
    Sandbox.objects.filter(pk=sandbox_id).update(end_at=timezone.now() - timedelta(seconds=1))


def make_stale(sandbox_id: str, state: str) -> None:
    Sandbox.objects.filter(pk=sandbox_id).update(
        state=state, state_changed_at=timezone.now() - LONG_AGO
    )


# ------------------------------------------------------------------------------ timeouts
def test_the_worker_kills_an_expired_sandbox_and_leaves_the_others(
    create_sandbox: CreateSandbox, runtime: LocalRuntime, worker_log: pytest.LogCaptureFixture
) -> None:
    expired_id = create_sandbox(timeout=60)["sandboxID"]
    alive_id = create_sandbox(timeout=60)["sandboxID"]
    expire(expired_id)

    run_once(worker_log)

    expired = row(expired_id)
    assert expired.state == State.KILLED
    assert expired.killed_at is not None
    assert runtime_state(runtime, expired_id) is None
    assert row(alive_id).state == State.RUNNING
    assert runtime_state(runtime, alive_id) is SandboxState.RUNNING


def test_the_worker_pauses_an_expired_sandbox_created_with_auto_pause(
    api_client: APIClient,
    create_sandbox: CreateSandbox,
    runtime: LocalRuntime,
    worker_log: pytest.LogCaptureFixture,
) -> None:
    sandbox_id = create_sandbox(timeout=60, autoPause=True)["sandboxID"]
    assert api_client.get(f"/sandboxes/{sandbox_id}").json()["lifecycle"]["onTimeout"] == "pause"
    expire(sandbox_id)

    run_once(worker_log)

    assert row(sandbox_id).state == State.PAUSED
    assert runtime_state(runtime, sandbox_id) is SandboxState.PAUSED
    # Paused, not gone: connect brings it back.
    assert api_client.post(f"/v2/sandboxes/{sandbox_id}/connect").status_code == 201
    assert runtime_state(runtime, sandbox_id) is SandboxState.RUNNING


def test_the_worker_leaves_an_expired_paused_sandbox_alone(
    api_client: APIClient,
    create_sandbox: CreateSandbox,
    runtime: LocalRuntime,
    worker_log: pytest.LogCaptureFixture,
) -> None:
    sandbox_id = create_sandbox(timeout=60)["sandboxID"]
    api_client.post(f"/sandboxes/{sandbox_id}/pause")
    expire(sandbox_id)

    run_once(worker_log)

    assert row(sandbox_id).state == State.PAUSED
    assert runtime_state(runtime, sandbox_id) is SandboxState.PAUSED


# ------------------------------------------------------------------ abandoned transitions
@pytest.mark.parametrize(
    ("frozen_in_runtime", "settled"),
    [(True, State.PAUSED), (False, State.RUNNING)],
    ids=["pause-reached-the-runtime", "pause-never-reached-the-runtime"],
)
@pytest.mark.parametrize("abandoned", [State.PAUSING, State.RESUMING])
def test_an_abandoned_pause_or_resume_settles_to_what_the_runtime_reports(
    create_sandbox: CreateSandbox,
    runtime: LocalRuntime,
    worker_log: pytest.LogCaptureFixture,
    abandoned: str,
    frozen_in_runtime: bool,
    settled: str,
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    if frozen_in_runtime:
        runtime.pause(sandbox_id)
    make_stale(sandbox_id, abandoned)

    run_once(worker_log, "--stale-after", "0")

    assert row(sandbox_id).state == settled
    expected = SandboxState.PAUSED if frozen_in_runtime else SandboxState.RUNNING
    assert runtime_state(runtime, sandbox_id) is expected


def test_an_abandoned_pause_of_a_sandbox_that_died_settles_to_killed(
    create_sandbox: CreateSandbox, runtime: LocalRuntime, worker_log: pytest.LogCaptureFixture
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    runtime.kill(sandbox_id)
    make_stale(sandbox_id, State.PAUSING)

    run_once(worker_log, "--stale-after", "0")

    assert row(sandbox_id).state == State.KILLED
    assert runtime_state(runtime, sandbox_id) is None


def test_an_abandoned_kill_is_finished(
    create_sandbox: CreateSandbox, runtime: LocalRuntime, worker_log: pytest.LogCaptureFixture
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    make_stale(sandbox_id, State.KILLING)

    run_once(worker_log, "--stale-after", "0")

    assert row(sandbox_id).state == State.KILLED
    assert row(sandbox_id).killed_at is not None
    assert runtime_state(runtime, sandbox_id) is None


def test_an_abandoned_create_is_dropped_and_nothing_runs(
    create_sandbox: CreateSandbox, runtime: LocalRuntime, worker_log: pytest.LogCaptureFixture
) -> None:
    # The creator died after the runtime started the sandbox but before it answered.
    started_id = create_sandbox()["sandboxID"]
    make_stale(started_id, State.CREATING)
    # The creator died before the runtime was called.
    never_started = SandboxFactory.create(
        team=row(started_id).team,
        state=State.CREATING,
        started_at=timezone.now() - LONG_AGO,
    )

    run_once(worker_log, "--stale-after", "0")

    assert not Sandbox.objects.filter(pk__in=[started_id, never_started.pk]).exists()
    assert runtime.list() == []


def test_a_transition_younger_than_stale_after_is_left_alone(
    create_sandbox: CreateSandbox, runtime: LocalRuntime, worker_log: pytest.LogCaptureFixture
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    Sandbox.objects.filter(pk=sandbox_id).update(
        state=State.KILLING, state_changed_at=timezone.now()
    )

    run_once(worker_log)  # --stale-after defaults to 30 s

    assert row(sandbox_id).state == State.KILLING
    assert runtime_state(runtime, sandbox_id) is SandboxState.RUNNING


# -------------------------------------------------------------------------- reconciling
def test_reconcile_kills_a_runtime_sandbox_the_database_does_not_know(
    create_sandbox: CreateSandbox, runtime: LocalRuntime, worker_log: pytest.LogCaptureFixture
) -> None:
    known_id = create_sandbox()["sandboxID"]
    runtime.create(SandboxSpec(sandbox_id="orphan0000000000000000", image_id="base"))

    run_once(worker_log)

    assert runtime_state(runtime, "orphan0000000000000000") is None
    assert runtime_state(runtime, known_id) is SandboxState.RUNNING
    assert row(known_id).state == State.RUNNING


def test_reconcile_kills_a_runtime_sandbox_whose_row_is_killed(
    create_sandbox: CreateSandbox, runtime: LocalRuntime, worker_log: pytest.LogCaptureFixture
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    Sandbox.objects.filter(pk=sandbox_id).update(state=State.KILLED)

    run_once(worker_log)

    assert runtime_state(runtime, sandbox_id) is None


@pytest.mark.parametrize("paused", [False, True], ids=["running", "paused"])
def test_reconcile_marks_killed_a_sandbox_killed_behind_our_back(
    api_client: APIClient,
    create_sandbox: CreateSandbox,
    runtime: LocalRuntime,
    worker_log: pytest.LogCaptureFixture,
    paused: bool,
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    if paused:
        api_client.post(f"/sandboxes/{sandbox_id}/pause")
    runtime.kill(sandbox_id)

    run_once(worker_log)

    assert row(sandbox_id).state == State.KILLED
    assert row(sandbox_id).killed_at is not None
    assert api_client.get(f"/sandboxes/{sandbox_id}").status_code == 404


def test_a_call_on_a_sandbox_killed_behind_our_back_answers_404_and_records_it(
    api_client: APIClient, create_sandbox: CreateSandbox, runtime: LocalRuntime
) -> None:
    # Without waiting for the worker: the runtime's "no such sandbox" settles the row.
    sandbox_id = create_sandbox()["sandboxID"]
    runtime.kill(sandbox_id)

    response = api_client.post(f"/sandboxes/{sandbox_id}/pause")

    assert response.status_code == 404
    assert row(sandbox_id).state == State.KILLED


# --------------------------------------------------------------------- two workers at once
@postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_workers_at_once_act_on_each_expired_sandbox_exactly_once(
    create_sandbox: CreateSandbox, runtime: LocalRuntime, worker_log: pytest.LogCaptureFixture
) -> None:
    to_kill = [create_sandbox(timeout=60)["sandboxID"] for _ in range(5)]
    to_pause = [create_sandbox(timeout=60, autoPause=True)["sandboxID"] for _ in range(5)]
    for sandbox_id in to_kill + to_pause:
        expire(sandbox_id)

    def tick(i: int) -> None:
        # What `run_worker --once` runs, minus the signal handlers (main thread only).
        Command().tick(0, timedelta(seconds=30), full=True)

    run_at_once(2, tick)

    failures = [r for r in worker_log.records if "tick failed" in r.getMessage()]
    assert not failures, failures[0].exc_text
    # The worker logs "sandbox <id> timed out: <action>" once per action it took.
    acted = Counter(
        r.getMessage().split()[1]
        for r in worker_log.records
        if r.name == "e2bfacade.worker" and "timed out" in r.getMessage()
    )
    assert acted == Counter(to_kill + to_pause)  # each exactly once
    for sandbox_id in to_kill:
        assert row(sandbox_id).state == State.KILLED
        assert runtime_state(runtime, sandbox_id) is None
    for sandbox_id in to_pause:
        assert row(sandbox_id).state == State.PAUSED
        assert runtime_state(runtime, sandbox_id) is SandboxState.PAUSED


@pytest.mark.django_db(transaction=True)
def test_run_worker_once_works_outside_a_test_transaction(
    create_sandbox: CreateSandbox, runtime: LocalRuntime, worker_log: pytest.LogCaptureFixture
) -> None:
    sandbox_id = create_sandbox(timeout=60)["sandboxID"]
    expire(sandbox_id)

    run_once(worker_log, "--stale-after", "0")

    assert row(sandbox_id).state == State.KILLED
    assert runtime_state(runtime, sandbox_id) is None
