"""Stored requests and responses are encrypted at rest (a sandbox's body holds its
envdAccessToken; a request may hold envVars), and the keys can be rotated."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection, connections, transaction

from e2bfacade import crypto
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox
from tests.idempotency.conftest import PostFn
from tests.idempotency.factories import IdempotencyRecordFactory

pytestmark = [pytest.mark.both_databases, pytest.mark.usefixtures("runtime")]

SECRET_ENV = "s3cr3t-env-value-that-must-not-be-stored-in-clear"
BODY = {"templateID": "base", "timeout": 60, "envVars": {"API_TOKEN": SECRET_ENV}}
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs PostgreSQL: SQLite has no row locks, so a second connection cannot hold "
    "one record locked while the rotation runs",
)


def raw_columns(key: str) -> tuple[bytes, bytes]:
    """The two encrypted columns exactly as the database holds them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT request_encrypted, response_body_encrypted "
            "FROM idempotency_idempotencyrecord WHERE key = %s",
            [key],
        )
        request, response = cursor.fetchone()
    return bytes(request), bytes(response)


def fresh_keys() -> tuple[str, str]:
    return Fernet.generate_key().decode(), Fernet.generate_key().decode()


def test_stored_bodies_hold_no_plaintext(post: PostFn, key: str) -> None:
    created = post(BODY, key)
    assert created.status_code == 201
    sandbox = created.json()
    request_raw, response_raw = raw_columns(key)

    for secret in (sandbox["sandboxID"], sandbox["envdAccessToken"]):
        assert secret.encode() not in response_raw
        assert secret.encode() not in request_raw
    assert SECRET_ENV.encode() not in request_raw
    assert b"templateID" not in request_raw and b"sandboxID" not in response_raw
    # ... yet they are exactly what the service decrypts and replays.
    assert crypto.decrypt(response_raw) == created.content
    assert SECRET_ENV.encode() in crypto.decrypt(request_raw)


def test_records_written_under_the_old_key_stay_readable_during_and_after_rotation(
    post: PostFn, key: str, settings: Any
) -> None:
    old, new = fresh_keys()
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [old]
    first = post(BODY, key)
    assert first.status_code == 201

    # Step 1: the new key goes in front. Old records still replay.
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [new, old]
    during = post(BODY, key)
    assert during.content == first.content
    assert during["Idempotent-Replayed"] == "true"
    # A record written now is under the new key.
    other_key = key + "-2"
    assert post(BODY, other_key).status_code == 201
    Fernet(new.encode()).decrypt(raw_columns(other_key)[1])

    # Step 2: re-encrypt everything with the new key.
    out = io.StringIO()
    call_command("rotate_idempotency_keys", stdout=out)
    assert "re-encrypted 2 idempotency records" in out.getvalue()

    # Step 3: the old key is dropped. Everything still replays; nothing is under it.
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [new]
    after = post(BODY, key)
    assert after.content == first.content
    assert after["Idempotent-Replayed"] == "true"
    for k in (key, other_key):
        for blob in raw_columns(k):
            Fernet(new.encode()).decrypt(blob)
            with pytest.raises(InvalidToken):
                Fernet(old.encode()).decrypt(blob)


def test_without_rotation_dropping_the_old_key_makes_records_unreadable(
    post: PostFn, key: str, settings: Any
) -> None:
    old, new = fresh_keys()
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [old]
    assert post(BODY, key).status_code == 201

    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [new]  # the step the rotation command exists for
    with pytest.raises(ImproperlyConfigured, match="IDEMPOTENCY_ENCRYPTION_KEYS"):
        crypto.decrypt(raw_columns(key)[1])
    # A replay then says what is wrong, as an error the SDK can show; it never runs the
    # request a second time.
    replay = post(BODY, key)
    assert replay.status_code == 503
    assert replay.json()["error_code"] == "idempotency_record_unreadable"
    assert replay["Should-Retry"] == "false"
    assert Sandbox.objects.count() == 1


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_rotation_re_encrypts_a_record_that_is_locked_at_that_moment(settings: Any) -> None:
    """A claim holds its record's row lock for a few milliseconds; a rotation running at
    that moment must wait for it, not skip the record and leave it under the old key (which
    the operator is about to drop)."""
    old, new = fresh_keys()
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [old]
    records = IdempotencyRecordFactory.create_batch(3)
    busy = records[1]
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [new, old]

    locked, release = threading.Event(), threading.Event()

    def hold_row_lock() -> None:
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.select_for_update().get(pk=busy.pk)
                locked.set()
                release.wait(timeout=10)
        finally:
            connections.close_all()

    def rotate_in_thread() -> None:
        try:
            call_command("rotate_idempotency_keys", stdout=io.StringIO())
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_row_lock)
    holder.start()
    try:
        assert locked.wait(timeout=10)
        rotation = threading.Thread(target=rotate_in_thread)
        rotation.start()
        rotation.join(timeout=0.5)  # a correct rotation is now waiting for the lock
        release.set()
        rotation.join(timeout=10)
        assert not rotation.is_alive()
    finally:
        release.set()
        holder.join(timeout=10)

    still_under_old_key = []
    for record in IdempotencyRecord.objects.order_by("pk"):
        try:
            Fernet(new.encode()).decrypt(bytes(record.request_encrypted))
        except InvalidToken:
            still_under_old_key.append(record.pk)
    assert still_under_old_key == [], (
        "rotate_idempotency_keys skipped the record that was row-locked while it ran "
        f"(pk {busy.pk}); dropping the old key now would make it unreadable"
    )


def test_the_derived_key_printed_before_a_secret_change_keeps_old_bodies_readable(
    settings: Any,
) -> None:
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = []
    settings.SECRET_KEY = "the-old-secret-" + "x" * 40
    token = crypto.encrypt(b"stored before the change")
    out = io.StringIO()
    call_command("derived_encryption_key", stdout=out)
    old = out.getvalue().strip()
    settings.SECRET_KEY = "the-new-secret-" + "y" * 40
    with pytest.raises(ImproperlyConfigured):
        crypto.decrypt(token)  # the new secret's derived key cannot open it
    settings.IDEMPOTENCY_ENCRYPTION_KEYS = [Fernet.generate_key().decode(), old]
    assert crypto.decrypt(token) == b"stored before the change"
