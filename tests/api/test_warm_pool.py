"""A template's own warm pool (``Template.warm_pool``), through the API and the worker: the
worker keeps it, a create takes a pool sandbox and it becomes the create's sandbox, a keyed
retry answers that same sandbox, no listing shows a pool sandbox, and emptying the pool
ends its sandboxes. The runtime side is tests/runtime/test_warm.py."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from rest_framework.test import APIClient

from e2bfacade.models import Team
from e2bfacade.runtime.base import ImageBuild, StartCommand
from e2bfacade.runtime.local import LocalRuntime
from e2bfacade.runtime.local.pools import warm
from sandboxes import worker
from templates.models import Template
from tests.runtime.helpers import ok
from tests.support.waiting import eventually

BODY = {"templateID": "base", "timeout": 300, "envVars": {"FROM": "the-create"}}


def ready(rt: LocalRuntime) -> list[Path]:
    return [p for ps in warm.ready_by_shape(rt.root / "sandboxes").values() for p in ps]


def test_a_templates_warm_pool_serves_its_creates_exactly_once(
    api_client: APIClient, runtime: LocalRuntime
) -> None:
    runtime.ensure_base_image()  # built by a host's first create otherwise
    Template.objects.filter(pk="base").update(warm_pool=1)
    assert "base" in worker.sandbox_keep_warm()
    eventually(lambda: ready(runtime), until=lambda r: len(r) == 1, within=30, what="1 ready")
    [pool_dir] = ready(runtime)
    pool_init = json.loads((pool_dir / "state.json").read_text())["init_pid"]
    assert api_client.get("/v2/sandboxes").json() == []  # no one's sandbox

    key = {"HTTP_IDEMPOTENCY_KEY": f"pool-{uuid.uuid4().hex}"}
    created = api_client.post("/v2/sandboxes", BODY, format="json", **key)  # type: ignore[arg-type]
    assert created.status_code == 201, created.content
    sid = created.json()["sandboxID"]
    info = runtime.status(sid)
    assert info.init_pid == pool_init, "the create did not take the pool sandbox"
    assert ok(runtime, sid, "hostname; echo $FROM $E2B_SANDBOX_ID") == f"{sid}\nthe-create {sid}\n"
    assert info.envd_access_token == created.json()["envdAccessToken"]
    again = api_client.post("/v2/sandboxes", BODY, format="json", **key)  # type: ignore[arg-type]
    assert again.content == created.content and again["Idempotent-Replayed"] == "true"
    assert [s["sandboxID"] for s in api_client.get("/v2/sandboxes").json()] == [sid]
    eventually(lambda: ready(runtime), until=lambda r: len(r) == 1, within=30, what="a refill")
    assert [s["sandboxID"] for s in api_client.get("/v2/sandboxes").json()] == [sid]

    # Emptied: the worker's next pass ends the pool's sandbox, and a create starts its own.
    with runtime.warm.filling:
        pass  # the refill has ended
    Template.objects.filter(pk="base").update(warm_pool=None)
    assert "base" not in worker.sandbox_keep_warm()
    assert ready(runtime) == []
    other = api_client.post("/v2/sandboxes", BODY, format="json")
    assert other.status_code == 201
    with runtime.warm.filling:
        pass  # no refill was started
    assert ready(runtime) == []


def test_by_default_only_a_public_template_with_a_start_command_gets_a_pool(
    runtime: LocalRuntime, team: Team
) -> None:
    runtime.ensure_base_image()
    image = f"started-{uuid.uuid4().hex[:8]}"
    runtime.build_image(
        ImageBuild(
            image_id=image,
            parent="base",
            populate=lambda root: None,
            start=StartCommand(argv=("sleep", "600"), user="root"),
        )
    )
    public = Template.objects.create(alias=f"pub-{image}", image_id=image)
    built = Template.objects.create(team=team, alias=f"team-{image}", image_id=image)
    try:
        asked = worker.sandbox_keep_warm()
        # A team may build any number of templates: none gets a pool unless asked for.
        assert public.pk in asked and built.pk not in asked
        Template.objects.filter(pk=built.pk).update(warm_pool=1)
        assert built.pk in worker.sandbox_keep_warm()
    finally:
        Template.objects.filter(pk__in=[public.pk, built.pk]).delete()
        worker.sandbox_keep_warm()
