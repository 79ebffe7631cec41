"""Retention: a key is remembered for IDEMPOTENCY_TTL_SECONDS from its first attempt,
never longer, and ``purge_idempotency_keys`` deletes what is past it — never a claim whose
owner may still be working. The clock is driven with time-machine."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.core.management import call_command

from e2bfacade.runtime.local import LocalRuntime
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox
from tests.idempotency.conftest import Crash, PostFn
from tests.idempotency.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.both_databases

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
TTL = 600
BODY = {"templateID": "base", "timeout": 60}
State = IdempotencyRecord.State


def purge(*args: str) -> str:
    out = io.StringIO()
    call_command("purge_idempotency_keys", *args, stdout=out)
    return out.getvalue()


# ----------------------------------------------------------------------- retention window
@pytest.mark.usefixtures("runtime")
def test_a_key_replays_until_its_ttl_and_creates_anew_after(
    post: PostFn, key: str, settings: Any, runtime: LocalRuntime
) -> None:
    settings.IDEMPOTENCY_TTL_SECONDS = TTL
    with time_machine.travel(T0, tick=False) as clock:
        first = post(BODY, key)
        assert first.status_code == 201
        record = IdempotencyRecord.objects.get()
        assert record.expires_at == T0 + timedelta(seconds=TTL)

        clock.move_to(T0 + timedelta(seconds=TTL - 1))
        last_replay = post(BODY, key)
        assert last_replay.content == first.content
        assert last_replay["Idempotent-Replayed"] == "true"

        clock.move_to(T0 + timedelta(seconds=TTL + 1))
        fresh = post(BODY, key)

    assert fresh.status_code == 201
    assert "Idempotent-Replayed" not in fresh
    assert fresh.json()["sandboxID"] != first.json()["sandboxID"]
    assert Sandbox.objects.count() == 2
    assert len(runtime.list()) == 2
    # The key now belongs to the new request, with a new retention window.
    record = IdempotencyRecord.objects.get()
    assert record.resource_id == fresh.json()["sandboxID"]
    assert record.expires_at == T0 + timedelta(seconds=2 * TTL + 1)


@pytest.mark.usefixtures("runtime")
def test_at_exactly_the_ttl_the_key_is_expired(post: PostFn, key: str, settings: Any) -> None:
    settings.IDEMPOTENCY_TTL_SECONDS = TTL
    with time_machine.travel(T0, tick=False) as clock:
        first = post(BODY, key)
        clock.move_to(T0 + timedelta(seconds=TTL))
        second = post(BODY, key)

    assert "Idempotent-Replayed" not in second
    assert second.json()["sandboxID"] != first.json()["sandboxID"]


@pytest.mark.usefixtures("runtime")
def test_after_the_ttl_the_key_may_carry_a_different_request(
    post: PostFn, key: str, settings: Any
) -> None:
    settings.IDEMPOTENCY_TTL_SECONDS = TTL
    with time_machine.travel(T0, tick=False) as clock:
        assert post(BODY, key).status_code == 201
        assert post({**BODY, "timeout": 61}, key).status_code == 409
        clock.move_to(T0 + timedelta(seconds=TTL + 1))
        assert post({**BODY, "timeout": 61}, key).status_code == 201


@pytest.mark.usefixtures("runtime")
def test_replays_never_extend_retention(post: PostFn, key: str, settings: Any) -> None:
    settings.IDEMPOTENCY_TTL_SECONDS = TTL
    with time_machine.travel(T0, tick=False) as clock:
        post(BODY, key)
        for offset in (1, 100, 300, TTL - 1):
            clock.move_to(T0 + timedelta(seconds=offset))
            assert post(BODY, key)["Idempotent-Replayed"] == "true"
            post({**BODY, "timeout": 99}, key)  # a mismatch does not extend it either

    record = IdempotencyRecord.objects.get()
    assert (record.created_at, record.expires_at) == (T0, T0 + timedelta(seconds=TTL))


@pytest.mark.usefixtures("runtime")
def test_a_takeover_never_extends_retention(
    post: PostFn, key: str, settings: Any, crash_at: Callable[[str], None]
) -> None:
    settings.IDEMPOTENCY_TTL_SECONDS = TTL
    settings.IDEMPOTENCY_LEASE_SECONDS = 30
    crash_at("after_claim")
    with time_machine.travel(T0, tick=False) as clock:
        with pytest.raises(Crash):
            post(BODY, key)
        clock.move_to(T0 + timedelta(seconds=31))  # the dead owner's lease ran out
        retry = post(BODY, key)

    assert retry.status_code == 201
    record = IdempotencyRecord.objects.get()
    assert record.attempt == 2
    assert record.lease_expires_at == T0 + timedelta(seconds=31 + 30)
    assert (record.created_at, record.expires_at) == (T0, T0 + timedelta(seconds=TTL))


# ------------------------------------------------------------------------------- purge
@pytest.mark.django_db
def test_purge_keeps_a_record_one_second_before_expiry_and_deletes_one_at_expiry() -> None:
    kept = IdempotencyRecordFactory.create(expires_at=T0 + timedelta(seconds=1))
    IdempotencyRecordFactory.create(expires_at=T0)
    IdempotencyRecordFactory.create(expires_at=T0 - timedelta(seconds=1))

    with time_machine.travel(T0, tick=False):
        out = purge()

    assert "deleted 2 expired idempotency records" in out
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [kept.pk]


@pytest.mark.django_db
def test_purge_never_deletes_an_in_progress_record_whose_lease_is_live() -> None:
    past_retention = T0 - timedelta(hours=1)
    live = IdempotencyRecordFactory.create(
        state=State.IN_PROGRESS,
        expires_at=past_retention,
        lease_expires_at=T0 + timedelta(seconds=1),
    )
    IdempotencyRecordFactory.create(
        state=State.IN_PROGRESS, expires_at=past_retention, lease_expires_at=T0
    )
    IdempotencyRecordFactory.create(
        state=State.IN_PROGRESS, expires_at=past_retention, lease_expires_at=T0 - timedelta(hours=2)
    )

    with time_machine.travel(T0, tick=False):
        out = purge()

    assert "deleted 2 expired idempotency records" in out
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [live.pk]


@pytest.mark.django_db
def test_purge_dry_run_counts_and_deletes_nothing() -> None:
    IdempotencyRecordFactory.create_batch(4, expires_at=T0 - timedelta(minutes=5))
    IdempotencyRecordFactory.create(
        state=State.IN_PROGRESS,
        expires_at=T0 - timedelta(minutes=5),
        lease_expires_at=T0 + timedelta(minutes=1),
    )
    IdempotencyRecordFactory.create_batch(2, expires_at=T0 + timedelta(minutes=5))

    with time_machine.travel(T0, tick=False):
        out = purge("--dry-run")

    assert "would delete 4 expired idempotency records" in out
    assert IdempotencyRecord.objects.count() == 7


@pytest.mark.django_db
def test_purge_in_batches_of_three_deletes_all_ten() -> None:
    IdempotencyRecordFactory.create_batch(10, expires_at=T0 - timedelta(seconds=5))
    live = IdempotencyRecordFactory.create(expires_at=T0 + timedelta(seconds=5))

    with time_machine.travel(T0, tick=False):
        out = purge("--batch-size", "3")

    assert "deleted 10 expired idempotency records" in out
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [live.pk]


@pytest.mark.django_db
def test_purge_with_nothing_to_do_says_so() -> None:
    assert "deleted 0 expired idempotency records" in purge()


@pytest.mark.django_db
def test_purge_refuses_a_batch_size_below_one() -> None:
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("purge_idempotency_keys", "--batch-size", "0", stderr=err)
    assert exit_info.value.code == 2
    assert "--batch-size" in err.getvalue()
