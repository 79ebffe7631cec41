"""The build state machine's request step, in the database: a build requested and never
triggered ends on the team's next request after an hour, instead of counting against the
team's limit of builds in progress for ever; and ``POST /v3/templates`` with an
Idempotency-Key makes one build per key, as every other create does."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from e2bfacade.models import Team
from idempotency import claims as idempotency_claims
from idempotency import maintenance
from idempotency.models import IdempotencyRecord
from templates.builds import services
from templates.models import BuildStatus, TemplateBuild


class Crash(BaseException):
    """A process dying at a failpoint (BaseException: no handler of the code catches it)."""


def request(team: Team, name: str) -> services.Requested:
    return services.build_request(team=team, body=services.build_request_body({"name": name}))


def test_a_build_never_triggered_ends_and_frees_the_teams_limit(team: Team, settings: Any) -> None:
    settings.TEMPLATE_BUILDS_PER_TEAM = 2
    stale = [request(team, f"t{n}").build for n in range(2)]
    TemplateBuild.objects.filter(pk__in=[b.pk for b in stale]).update(
        created_at=timezone.now() - timedelta(seconds=services.WAITING_SECONDS + 1)
    )
    # At the limit, but both are stale: a third request is admitted, and they end.
    fresh = request(team, "t2").build
    assert fresh.status == BuildStatus.WAITING
    for build in stale:
        build.refresh_from_db()
        assert build.status == BuildStatus.ERROR
        assert build.reason == {"message": services.NEVER_STARTED}
    # One fresh waiting build and one more still fit; a third is E2B's 429.
    request(team, "t3")
    try:
        request(team, "t4")
    except services.TooManyBuilds as exc:
        assert "maximum number of concurrent template builds (2)" in exc.message
    else:
        raise AssertionError("a third build in progress was admitted")


# -------------------------------------------------------------------------- idempotency
def post(client: APIClient, key: str | None, **body: Any) -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post("/v3/templates", body, format="json", headers=headers)


def test_a_keyed_request_makes_one_build_replays_it_and_a_different_body_is_409(
    api_client: APIClient,
) -> None:
    key = str(uuid.uuid4())
    first = post(api_client, key, name="keyed", tags=["v1"], cpuCount=1, memoryMB=512)
    assert first.status_code == 202, first.content
    again = post(api_client, key, name="keyed", tags=["v1"], cpuCount=1, memoryMB=512)
    assert again.status_code == 202
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    build = TemplateBuild.objects.get()
    assert str(build.build_id) == first.json()["buildID"]
    assert build.status == BuildStatus.WAITING  # the replay superseded nothing
    other = post(api_client, key, name="keyed", tags=["v2"], cpuCount=1, memoryMB=512)
    assert other.status_code == 409
    assert other.json()["error_code"] == "idempotency_request_mismatch"
    assert TemplateBuild.objects.count() == 1
    # Without a key each request is a new build, superseding the waiting one (E2B's rule).
    assert post(api_client, None, name="keyed", tags=["v1"]).status_code == 202
    assert TemplateBuild.objects.count() == 2


def test_a_bad_request_is_400_and_records_nothing(api_client: APIClient) -> None:
    key = str(uuid.uuid4())
    assert post(api_client, key, name="Bad Name!").status_code == 400
    assert post(api_client, key, name="fine", cpuCount=3).status_code == 400
    assert not IdempotencyRecord.objects.exists()
    assert post(api_client, key, name="fine").status_code == 202


def test_a_request_that_died_after_its_claim_or_its_build_is_re_driven_to_that_build(
    api_client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for point in ("after_claim", "before_complete"):
        key = str(uuid.uuid4())
        fired: list[str] = []

        def failpoint(name: str, point: str = point, fired: list[str] = fired) -> None:
            if name == point and not fired:
                fired.append(name)
                raise Crash(name)

        monkeypatch.setattr(idempotency_claims, "failpoint", failpoint)
        with pytest.raises(Crash):
            post(api_client, key, name=f"crash-{point.replace('_', '-')}")
        record = IdempotencyRecord.objects.get(key=key)
        made = TemplateBuild.objects.filter(pk=record.resource_id).exists()
        assert made == (point == "before_complete")
        IdempotencyRecord.objects.filter(pk=record.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        retry = post(api_client, key, name=f"crash-{point.replace('_', '-')}")
        assert retry.status_code == 202, retry.content
        assert retry.json()["buildID"] == record.resource_id
        assert TemplateBuild.objects.filter(pk=record.resource_id).count() == 1
    assert TemplateBuild.objects.count() == 2


def test_the_worker_finishes_a_keyed_request_whose_client_never_retried(
    api_client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = str(uuid.uuid4())

    def failpoint(name: str) -> None:
        if name == "after_claim":
            raise Crash(name)

    monkeypatch.setattr(idempotency_claims, "failpoint", failpoint)
    with pytest.raises(Crash):
        post(api_client, key, name="abandoned")
    monkeypatch.undo()
    record = IdempotencyRecord.objects.get(key=key)
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert record.pk in maintenance.drive_abandoned()
    assert TemplateBuild.objects.filter(pk=record.resource_id).exists()
    replay = post(api_client, key, name="abandoned")
    assert replay.status_code == 202 and replay.json()["buildID"] == record.resource_id


def test_a_build_request_on_a_host_whose_runtime_cannot_start_is_a_503_never_a_500(
    api_client: APIClient, settings: Any, tmp_path: Any
) -> None:
    (tmp_path / "file").write_text("")
    settings.SANDBOX_ROOT = tmp_path / "file" / "root"  # a root that cannot be made
    response = post(api_client, None, name="no-runtime")
    assert response.status_code == 503, response.content
    assert "template builds are unavailable on this host" in response.json()["message"]
    assert response["Retry-After"] == "5"
    assert not TemplateBuild.objects.exists()
    # The sandbox create answers the same runtime's refusal as a 503 too.
    create = api_client.post("/v2/sandboxes", {"templateID": "base"}, format="json")
    assert create.status_code == 503, create.content
