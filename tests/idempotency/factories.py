"""A factory for idempotency records, for the tests that need a record in a given state
(expired, abandoned, out of attempts) without driving a request to it."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import factory
from django.utils import timezone
from factory.django import DjangoModelFactory

from e2bfacade import crypto
from idempotency.models import IdempotencyRecord
from tests.support.factories import TeamFactory


class IdempotencyRecordFactory(DjangoModelFactory[IdempotencyRecord]):
    """A completed ``POST /v2/sandboxes`` record created now, kept for a day. Its stored
    request and response are real ciphertexts, as the service writes them."""

    class Meta:
        model = IdempotencyRecord

    team = factory.SubFactory(TeamFactory)
    key = factory.LazyFunction(lambda: str(uuid.uuid4()))
    route = "POST /v2/sandboxes"
    fingerprint = factory.Sequence(lambda n: f"v1:{n:064x}")
    state = IdempotencyRecord.State.COMPLETED
    lease_owner = factory.LazyFunction(lambda: uuid.uuid4().hex)
    created_at = factory.LazyFunction(timezone.now)
    lease_expires_at = factory.LazyAttribute(lambda o: o.created_at + timedelta(seconds=30))
    expires_at = factory.LazyAttribute(lambda o: o.created_at + timedelta(days=1))
    attempt = 1
    resource_id = factory.Sequence(lambda n: f"i{n:020d}")
    request_encrypted = factory.LazyFunction(
        lambda: crypto.encrypt(json.dumps({"params": {}, "body": {}}).encode())
    )
    response_status = factory.LazyAttribute(
        lambda o: 201 if o.state == IdempotencyRecord.State.COMPLETED else None
    )
    response_content_type = "application/json"
    response_body_encrypted = factory.LazyAttribute(
        lambda o: (
            crypto.encrypt(b'{"sandboxID":"x"}')
            if o.state == IdempotencyRecord.State.COMPLETED
            else None
        )
    )
