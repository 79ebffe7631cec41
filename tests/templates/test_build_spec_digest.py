"""What a trigger keeps of a build's registry credentials: the spec digest that recognises
a replayed trigger is an HMAC under the service's secret (not a hash anyone can recompute
to test a guessed password), and it goes, with the encrypted credentials, when the build
ends — ready or error."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import pytest

from e2bfacade.errors import BadRequest
from e2bfacade.models import Team
from templates.builds import services, worker
from templates.builds.steps import Context
from templates.models import BuildStatus, Template, TemplateBuild

PASSWORD = "hunter2-registry-Pa55"


def _waiting(team: Team, alias: str) -> TemplateBuild:
    template = Template.objects.create(
        team=team, alias=alias, image_id="", cpu_count=2, memory_mb=1024
    )
    return TemplateBuild.objects.create(
        template=template, team=team, status=BuildStatus.WAITING, tags=["default"]
    )


def _body(password: str = PASSWORD) -> dict[str, Any]:
    return {
        "fromImage": "registry.example.com/team/app:1",
        "fromImageRegistry": {"type": "registry", "username": "ci", "password": password},
        "steps": [{"type": "RUN", "args": ["true"]}],
    }


def _trigger(build: TemplateBuild, body: dict[str, Any]) -> TemplateBuild:
    return services.build_trigger(
        team=build.team,
        template_ref=build.template.template_id,
        build_id=str(build.build_id),
        body=body,
    )


def test_the_spec_digest_is_no_plain_hash_of_the_credentials(team: Team) -> None:
    build = _waiting(team, "digest")
    body = _body()
    _trigger(build, body)
    build.refresh_from_db()
    plain = hashlib.sha256(
        json.dumps([services.spec_of(body), body["fromImageRegistry"]], sort_keys=True).encode()
    ).hexdigest()
    assert build.spec_digest and build.spec_digest != plain
    # An offline guess needs the secret: the digest of the right password under no key,
    # or under the wrong one, is not what is stored.
    assert PASSWORD not in build.spec_digest
    # A replay of the same trigger is still recognised; another password is another body.
    assert _trigger(build, body).pk == build.pk
    with pytest.raises(BadRequest):
        _trigger(build, _body("another-password"))


@pytest.mark.parametrize("end", ["error", "ready"])
def test_nothing_derived_from_the_credentials_outlives_the_build(team: Team, end: str) -> None:
    build = _waiting(team, f"ends-{end}")
    body = _body()
    _trigger(build, body)
    build.refresh_from_db()
    assert build.spec_digest and build.registry_auth
    if end == "error":
        services.finish_error(build, "failed", step=None)
    else:
        TemplateBuild.objects.filter(pk=build.pk).update(lease_owner="w1")
        worker._finish_ready(build, "w1", "img-1", Context(user="user"), time.monotonic())
    build.refresh_from_db()
    assert build.status == end
    assert build.spec_digest == "" and build.registry_auth is None
    # A replay of the trigger that started it is still answered as one (the spec is kept,
    # free of credentials).
    assert _trigger(build, body).pk == build.pk
