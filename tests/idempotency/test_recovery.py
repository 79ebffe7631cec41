"""When the original request dies, fails or never finishes: takeover by a retry, release of
a key whose attempt provably allocated nothing, 422 once a key has used up its attempts,
the lifecycle worker finishing abandoned claims, and the stale-transition sweep leaving a
keyed create alone. A process dying is played by :func:`tests.idempotency.conftest.crash_at`."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from e2bfacade.models import Team
from e2bfacade.runtime.base import SandboxState
from e2bfacade.runtime.local import LocalRuntime
from idempotency import claims as idempotency_claims
from idempotency import leases, maintenance
from idempotency.models import IdempotencyRecord
from sandboxes import worker as sandbox_worker
from sandboxes.models import Sandbox
from tests.idempotency.conftest import Crash, PostFn
from tests.support.factories import SandboxFactory, TemplateFactory

pytestmark = [pytest.mark.both_databases, pytest.mark.usefixtures("runtime")]

BODY = {"templateID": "base", "timeout": 120}
POINTS = ["after_claim", "after_runtime_create", "before_complete"]
State = IdempotencyRecord.State
on_postgres = connection.vendor == "postgresql"
postgres_only = pytest.mark.skipif(
    not on_postgres,
    reason="advisory locks exist only on PostgreSQL; SQLite relies on the time-based lease",
)


def expire_lease(record: IdempotencyRecord) -> None:
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def crashed_claim(post: PostFn, key: str, crash_at: Callable[[str], None], point: str) -> Any:
    """Send a keyed create that dies at ``point``; return its (in-progress) record."""
    crash_at(point)
    with pytest.raises(Crash):
        post(BODY, key)
    return IdempotencyRecord.objects.get(key=key)


@pytest.fixture
def other_connection() -> Iterator[psycopg.Connection[Any]]:
    """A second session on the test database: it plays a live owner holding its lock."""
    s = connection.settings_dict
    conn = psycopg.connect(
        host=s["HOST"] or None,
        port=s["PORT"] or None,
        user=s["USER"],
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
        autocommit=True,
    )
    yield conn
    conn.close()


def hold_advisory_lock(conn: psycopg.Connection[Any], record: IdempotencyRecord) -> None:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", [leases.advisory_lock_key(record.pk)])
    assert row.fetchone() == (True,)


def advisory_locks_held_here() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


# ----------------------------------------------------------------------------- takeover
@pytest.mark.parametrize("point", POINTS)
def test_a_retry_after_the_owner_died_re_drives_the_same_sandbox(
    post: PostFn, key: str, crash_at: Callable[[str], None], point: str, runtime: LocalRuntime
) -> None:
    record = crashed_claim(post, key, crash_at, point)
    assert record.state == State.IN_PROGRESS
    assert Sandbox.objects.get().pk == record.resource_id  # the intent was durable
    if not on_postgres:
        expire_lease(record)  # SQLite has only the lease; PostgreSQL sees the lock is free

    retry = post(BODY, key)

    assert retry.status_code == 201, retry.content
    assert retry.json()["sandboxID"] == record.resource_id
    assert "Idempotent-Replayed" not in retry  # it ran (re-drove) rather than replayed
    record.refresh_from_db()
    assert (record.state, record.attempt) == (State.COMPLETED, 2)
    assert Sandbox.objects.get().state == Sandbox.State.RUNNING
    assert [i.sandbox_id for i in runtime.list()] == [record.resource_id]
    # And from now on it replays.
    assert post(BODY, key).content == retry.content


def test_a_response_lost_after_commit_is_replayed(
    post: PostFn, key: str, crash_at: Callable[[str], None], runtime: LocalRuntime
) -> None:
    record = crashed_claim(post, key, crash_at, "after_complete")
    assert record.state == State.COMPLETED

    retry = post(BODY, key)

    assert retry.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.json()["sandboxID"] == record.resource_id
    assert record.attempt == 1
    assert len(runtime.list()) == 1


def test_on_sqlite_a_retry_within_a_dead_owners_lease_is_told_to_retry(
    post: PostFn, key: str, crash_at: Callable[[str], None], settings: Any
) -> None:
    if on_postgres:
        pytest.skip("on PostgreSQL the free advisory lock proves the owner dead: see below")
    settings.IDEMPOTENCY_WAIT_SECONDS = 0.1
    crashed_claim(post, key, crash_at, "after_claim")

    retry = post(BODY, key)

    assert retry.status_code == 409
    assert retry.json()["error_code"] == "idempotency_in_progress"
    assert retry["Retry-After"] == "1"
    assert retry["Should-Retry"] == "true"


@postgres_only
def test_a_live_owner_holding_its_advisory_lock_keeps_the_key(
    post: PostFn,
    key: str,
    crash_at: Callable[[str], None],
    settings: Any,
    other_connection: psycopg.Connection[Any],
) -> None:
    settings.IDEMPOTENCY_WAIT_SECONDS = 0.1
    record = crashed_claim(post, key, crash_at, "after_claim")
    hold_advisory_lock(other_connection, record)

    busy = post(BODY, key)
    assert busy.status_code == 409, busy.content
    assert busy.json()["error_code"] == "idempotency_in_progress"
    assert (busy["Retry-After"], busy["Should-Retry"]) == ("1", "true")

    other_connection.close()  # the owner's connection drops: its lock goes with it
    retry = post(BODY, key)
    assert retry.status_code == 201
    assert retry.json()["sandboxID"] == record.resource_id


@postgres_only
def test_a_live_owner_holding_its_advisory_lock_keeps_the_key_past_its_lease(
    post: PostFn,
    key: str,
    crash_at: Callable[[str], None],
    settings: Any,
    other_connection: psycopg.Connection[Any],
) -> None:
    """The owner is slow, not dead: its connection still holds the record's advisory lock.
    On PostgreSQL that lock, not the clock, says whether the owner is alive, so the key
    stays its own and a retry is told to come back (nobody re-drives beside it)."""
    settings.IDEMPOTENCY_WAIT_SECONDS = 0.1
    record = crashed_claim(post, key, crash_at, "after_claim")
    hold_advisory_lock(other_connection, record)
    expire_lease(record)

    retry = post(BODY, key)

    assert retry.status_code == 409, (
        f"a retry took over from a live owner whose lease had run out: {retry.content!r}"
    )
    assert retry.json()["error_code"] == "idempotency_in_progress"
    record.refresh_from_db()
    assert record.attempt == 1


@postgres_only
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(BODY, id="created"),
        pytest.param({"templateID": "no-such-template"}, id="refused-at-claim-404"),
        pytest.param({"templateID": "base", "timeout": 10**9}, id="refused-at-claim-400"),
    ],
)
def test_no_outcome_leaves_an_advisory_lock_behind_on_the_connection(
    post: PostFn, key: str, body: dict[str, Any]
) -> None:
    """Session advisory locks outlive the request on a persistent connection
    (CONN_MAX_AGE): one left behind per request would fill PostgreSQL's lock table."""
    before = advisory_locks_held_here()
    post(body, key)
    post(body, key)  # the replay
    assert advisory_locks_held_here() == before


@postgres_only
def test_the_owner_holds_the_advisory_lock_exactly_from_its_insert_to_its_completion(
    post: PostFn,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
    other_connection: psycopg.Connection[Any],
) -> None:
    """The claim's INSERT takes the lock and the completing UPDATE frees it, each in the
    statement itself: checked from another session, as a retry in another process would."""

    def free_elsewhere() -> bool:
        record = IdempotencyRecord.objects.get(key=key)
        lock = leases.advisory_lock_key(record.pk)
        row = other_connection.execute("SELECT pg_try_advisory_lock(%s)", [lock]).fetchone()
        assert row is not None
        got = row[0]
        if got:
            other_connection.execute("SELECT pg_advisory_unlock(%s)", [lock])
        return bool(got)

    seen: dict[str, bool] = {}

    def failpoint(name: str) -> None:
        if name in ("after_claim", "before_complete", "after_complete"):
            seen[name] = free_elsewhere()

    monkeypatch.setattr(idempotency_claims, "failpoint", failpoint)
    assert post(BODY, key).status_code == 201
    assert seen == {"after_claim": False, "before_complete": False, "after_complete": True}
    assert free_elsewhere()
    assert advisory_locks_held_here() == 0


# ------------------------------------------------------------------------------ release
def test_a_runtime_refusal_releases_the_key_for_another_request(
    post: PostFn, key: str, team: Team, runtime: LocalRuntime
) -> None:
    TemplateFactory.create(team=team, alias="broken", image_id="missing-image")

    refused = post({"templateID": "broken"}, key)

    assert refused.status_code == 503, refused.content
    assert refused.json()["code"] == 503
    assert refused["Should-Retry"] == "false"  # a missing image will not appear by retrying
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    assert Sandbox.objects.count() == 0
    assert runtime.list() == []

    # The same failure again is executed again (not a stored 503)...
    again = post({"templateID": "broken"}, key)
    assert again.status_code == 503
    assert "Idempotent-Replayed" not in again
    # ... and the key can carry a different, valid request.
    created = post(BODY, key)
    assert created.status_code == 201
    assert "Idempotent-Replayed" not in created
    assert post(BODY, key)["Idempotent-Replayed"] == "true"
    assert len(runtime.list()) == 1


# -------------------------------------------------------------------------- attempts out
def test_a_key_whose_attempts_are_used_up_answers_422_outcome_unknown(
    post: PostFn, key: str, crash_at: Callable[[str], None], settings: Any
) -> None:
    record = crashed_claim(post, key, crash_at, "after_claim")
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        attempt=settings.IDEMPOTENCY_MAX_ATTEMPTS,
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )

    response = post(BODY, key)

    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == 422
    assert body["error_code"] == "idempotency_outcome_unknown"
    assert record.resource_id in body["message"]
    record.refresh_from_db()
    assert (record.state, record.attempt) == (State.IN_PROGRESS, settings.IDEMPOTENCY_MAX_ATTEMPTS)
    # The worker leaves it alone too: it is the client's to hear about.
    assert maintenance.drive_abandoned() == []
    assert post(BODY, key).status_code == 422


def test_one_attempt_short_of_the_maximum_is_still_re_driven(
    post: PostFn, key: str, crash_at: Callable[[str], None], settings: Any
) -> None:
    record = crashed_claim(post, key, crash_at, "after_claim")
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        attempt=settings.IDEMPOTENCY_MAX_ATTEMPTS - 1,
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )

    response = post(BODY, key)

    assert response.status_code == 201
    record.refresh_from_db()
    assert record.attempt == settings.IDEMPOTENCY_MAX_ATTEMPTS


# ------------------------------------------------------------------------------- worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("point", POINTS)
def test_the_worker_completes_an_abandoned_claim(
    post: PostFn, key: str, crash_at: Callable[[str], None], point: str, runtime: LocalRuntime
) -> None:
    record = crashed_claim(post, key, crash_at, point)
    expire_lease(record)

    call_command("run_worker", "--once", stdout=io.StringIO())

    record.refresh_from_db()
    assert (record.state, record.attempt, record.response_status) == (State.COMPLETED, 2, 201)
    sandbox = Sandbox.objects.get()
    assert (sandbox.pk, sandbox.state) == (record.resource_id, Sandbox.State.RUNNING)
    assert runtime.status(record.resource_id).state is SandboxState.RUNNING
    assert len(runtime.list()) == 1
    # The client that comes back later gets what the worker stored.
    retry = post(BODY, key)
    assert retry.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.json()["sandboxID"] == record.resource_id


@pytest.mark.django_db(transaction=True)
def test_the_worker_leaves_a_claim_whose_lease_is_live(
    post: PostFn, key: str, crash_at: Callable[[str], None]
) -> None:
    record = crashed_claim(post, key, crash_at, "after_claim")

    call_command("run_worker", "--once", stdout=io.StringIO())

    record.refresh_from_db()
    assert (record.state, record.attempt) == (State.IN_PROGRESS, 1)
    assert Sandbox.objects.get().state == Sandbox.State.CREATING


def test_the_stale_sweep_keeps_a_creating_sandbox_owned_by_an_in_progress_record(
    post: PostFn, key: str, crash_at: Callable[[str], None], team: Team
) -> None:
    record = crashed_claim(post, key, crash_at, "after_claim")
    long_ago = timezone.now() - timedelta(hours=1)
    Sandbox.objects.filter(pk=record.resource_id).update(state_changed_at=long_ago)
    # A creating row nobody owns (its unkeyed creator died): this one must go.
    orphan = SandboxFactory.create(
        team=team, state=Sandbox.State.CREATING, state_changed_at=long_ago
    )

    recovered = sandbox_worker.sandbox_recover_stale(older_than=timezone.now())

    assert recovered == [orphan.pk]
    assert not Sandbox.objects.filter(pk=orphan.pk).exists()
    assert Sandbox.objects.get(pk=record.resource_id).state == Sandbox.State.CREATING
    # So the key's retry still finds its reserved sandbox and finishes it.
    expire_lease(record)
    retry = post(BODY, key)
    assert retry.json()["sandboxID"] == record.resource_id
    assert Sandbox.objects.get(pk=record.resource_id).state == Sandbox.State.RUNNING


# ---------------------------------------------------------------------------- versioning
def test_a_record_under_an_unknown_fingerprint_version_is_answered_not_crashed(
    api_client: APIClient, post: PostFn, key: str
) -> None:
    """A record written by a newer release (say during a rolling upgrade) carries a
    fingerprint version this release does not know. It cannot prove the retry equivalent,
    so it must refuse it cleanly (409 mismatch), never answer 500."""
    assert post({"templateID": "no-such-template"}, key).status_code == 404
    IdempotencyRecord.objects.filter(key=key).update(fingerprint="v9:" + "0" * 64)
    api_client.raise_request_exception = False

    response = post({"templateID": "no-such-template"}, key)

    assert response.status_code == 409, response.content
    assert response.json()["error_code"] == "idempotency_request_mismatch"
