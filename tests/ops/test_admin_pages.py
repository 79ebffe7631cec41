"""The Django admin an operator uses: every page loads; sandboxes are found by id or
metadata and lead to their idempotency record; the record shows its lease, attempt,
retention and a redacted body; killing goes through the service."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from e2bfacade import crypto
from e2bfacade.models import ApiKey, Team
from e2bfacade.runtime.local import LocalRuntime
from idempotency.models import IdempotencyRecord
from sandboxes.models import Sandbox
from snapshots.models import Snapshot
from templates.models import Template
from tests.support.factories import SandboxFactory, TemplateFactory

pytestmark = pytest.mark.django_db


def _record(team: Team, key: str, resource_id: str, **fields: Any) -> IdempotencyRecord:
    now = timezone.now()
    values: dict[str, Any] = {
        "team": team,
        "key": key,
        "route": "POST /v2/sandboxes",
        "fingerprint": "v1:test",
        "state": IdempotencyRecord.State.IN_PROGRESS,
        "lease_owner": "owner-1",
        "lease_expires_at": now + timedelta(seconds=30),
        "resource_id": resource_id,
        "request_encrypted": crypto.encrypt(b'{"params": {}, "body": {}}'),
        "created_at": now,
        "expires_at": now + timedelta(days=1),
        **fields,
    }
    return IdempotencyRecord.objects.create(**values)


def test_every_admin_changelist_and_add_page_loads(admin_client: Client, team: Team) -> None:
    SandboxFactory.create(team=team, metadata={"tag": "x"})
    TemplateFactory.create(team=team, kind=Template.Kind.SNAPSHOT, source_sandbox_id="ifrom")
    _record(team, "any-key", "ianything")

    for model in admin.site._registry:
        opts = model._meta
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        response = admin_client.get(url)
        assert response.status_code == 200, url
        obj = model._default_manager.first()
        if obj is not None and model is not Snapshot:
            change = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
            assert admin_client.get(change).status_code == 200, change


def test_sandbox_admin_finds_a_sandbox_by_id_and_by_metadata(
    admin_client: Client, team: Team
) -> None:
    wanted = SandboxFactory.create(team=team, metadata={"project": "apollo-11"})
    other = SandboxFactory.create(team=team, metadata={"project": "gemini"})
    url = reverse("admin:sandboxes_sandbox_changelist")

    by_id = admin_client.get(url, {"q": wanted.sandbox_id})
    by_value = admin_client.get(url, {"q": "APOLLO"})
    by_key = admin_client.get(url, {"q": "project"})

    assert list(by_id.context["cl"].queryset) == [wanted]
    assert list(by_value.context["cl"].queryset) == [wanted]
    assert set(by_key.context["cl"].queryset) == {wanted, other}


def test_sandbox_admin_lists_wire_state_and_times(admin_client: Client) -> None:
    sandbox = SandboxFactory.create(state=Sandbox.State.PAUSING)

    page = admin_client.get(reverse("admin:sandboxes_sandbox_changelist")).content.decode()

    assert sandbox.sandbox_id in page
    assert "pausing" in page  # state
    assert "paused" in page  # wire state


def test_sandbox_admin_is_read_only(admin_client: Client) -> None:
    sandbox = SandboxFactory.create()
    change = reverse("admin:sandboxes_sandbox_change", args=[sandbox.pk])

    assert admin_client.get(reverse("admin:sandboxes_sandbox_add")).status_code == 403
    assert admin_client.post(change, {"state": "killed"}).status_code == 403
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.RUNNING


def test_sandbox_page_never_shows_its_access_token_or_env_values(admin_client: Client) -> None:
    sandbox = SandboxFactory.create(env_vars={"DB_PASSWORD": "s3cr3t-value"})

    page = admin_client.get(
        reverse("admin:sandboxes_sandbox_change", args=[sandbox.pk])
    ).content.decode()

    assert sandbox.envd_access_token not in page
    assert "s3cr3t-value" not in page
    assert "DB_PASSWORD" in page  # the names are useful and not secret


def test_a_keyed_sandbox_links_to_its_idempotency_record_which_shows_it_redacted(
    admin_client: Client, create_sandbox: Callable[..., Any], runtime: LocalRuntime
) -> None:
    created = create_sandbox(key="admin-link-key")
    assert created.status_code == 201
    sandbox_id, token = created.json()["sandboxID"], created.json()["envdAccessToken"]
    record = IdempotencyRecord.objects.get(resource_id=sandbox_id)

    sandbox_page = admin_client.get(reverse("admin:sandboxes_sandbox_change", args=[sandbox_id]))
    record_url = reverse("admin:idempotency_idempotencyrecord_change", args=[record.pk])
    assert f'href="{record_url}"' in sandbox_page.content.decode()

    record_page = admin_client.get(record_url).content.decode()
    assert "admin-link-key" in record_page
    assert "completed" in record_page
    assert "&quot;envdAccessToken&quot;: &quot;[redacted]&quot;" in record_page
    assert token not in record_page
    assert "live" in record_page and "EXPIRED" not in record_page
    # ... and back: the record links to its sandbox.
    assert reverse("admin:sandboxes_sandbox_change", args=[sandbox_id]) in record_page


def test_an_unkeyed_sandbox_says_it_has_no_record(admin_client: Client) -> None:
    sandbox = SandboxFactory.create()

    page = admin_client.get(reverse("admin:sandboxes_sandbox_change", args=[sandbox.pk]))

    assert "made without an Idempotency-Key" in page.content.decode()


def test_several_records_for_one_resource_link_to_the_filtered_list(
    admin_client: Client, team: Team
) -> None:
    sandbox = SandboxFactory.create(team=team)
    for key in ("first-key", "second-key"):
        _record(team, key, sandbox.sandbox_id)
    _record(team, "unrelated-key", "iunrelated")

    page = admin_client.get(reverse("admin:sandboxes_sandbox_change", args=[sandbox.pk]))
    changelist = reverse("admin:idempotency_idempotencyrecord_changelist")
    link = f"{changelist}?resource_id={sandbox.sandbox_id}"
    assert link in page.content.decode()

    listed = admin_client.get(link)
    assert {r.key for r in listed.context["cl"].queryset} == {"first-key", "second-key"}


def test_record_list_shows_lease_attempt_and_expired(admin_client: Client, team: Team) -> None:
    _record(team, "lease-key", "ilease", lease_owner="owner-abc", attempt=3)

    response = admin_client.get(reverse("admin:idempotency_idempotencyrecord_changelist"))

    page = response.content.decode()
    for column in ("column-lease_owner", "column-lease_expires_at", "column-attempt"):
        assert column in page
    assert "owner-abc" in page
    assert "column-expired" in page


def test_an_expired_record_is_marked_expired_on_its_page(admin_client: Client, team: Team) -> None:
    past = timezone.now() - timedelta(days=2)
    record = _record(
        team,
        "expired-key",
        "iexpired",
        state=IdempotencyRecord.State.COMPLETED,
        created_at=past,
        expires_at=past + timedelta(days=1),
    )

    page = admin_client.get(
        reverse("admin:idempotency_idempotencyrecord_change", args=[record.pk])
    ).content.decode()

    assert "EXPIRED" in page
    assert "purgeable" in page


def test_kill_action_kills_through_the_service_and_reports(
    admin_client: Client,
    create_sandbox: Callable[..., Any],
    runtime: LocalRuntime,
    api_client: APIClient,
) -> None:
    live = create_sandbox().json()["sandboxID"]
    already = SandboxFactory.create(state=Sandbox.State.KILLED)

    response = admin_client.post(
        reverse("admin:sandboxes_sandbox_changelist"),
        {"action": "kill_selected", "_selected_action": [live, already.pk]},
        follow=True,
    )

    assert response.status_code == 200
    messages = [str(m) for m in response.context["messages"]]
    assert "Killed 1 sandbox(es)." in messages
    assert Sandbox.objects.get(pk=live).state == Sandbox.State.KILLED
    assert live not in runtime.cgroups.list_ids()
    assert api_client.get(f"/sandboxes/{live}").status_code == 404


def test_kill_action_needs_the_change_permission(
    client: Client, django_user_model: Any, runtime: LocalRuntime
) -> None:
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_sandbox"))
    client.force_login(viewer)
    sandbox = SandboxFactory.create()

    page = client.get(reverse("admin:sandboxes_sandbox_changelist"))
    assert page.status_code == 200
    assert "kill_selected" not in page.content.decode()
    client.post(
        reverse("admin:sandboxes_sandbox_changelist"),
        {"action": "kill_selected", "_selected_action": [sandbox.pk]},
    )
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.RUNNING


def test_snapshot_admin_lists_only_snapshots_with_their_source(
    admin_client: Client, team: Team
) -> None:
    source = SandboxFactory.create(team=team)
    snapshot = TemplateFactory.create(
        team=team, kind=Template.Kind.SNAPSHOT, source_sandbox_id=source.sandbox_id
    )
    template = TemplateFactory.create(team=team)

    listed = admin_client.get(reverse("admin:snapshots_snapshot_changelist"))
    detail = admin_client.get(reverse("admin:snapshots_snapshot_change", args=[snapshot.pk]))

    assert [s.pk for s in listed.context["cl"].queryset] == [snapshot.pk]
    assert template.pk not in listed.content.decode()
    page = detail.content.decode()
    assert reverse("admin:sandboxes_sandbox_change", args=[source.sandbox_id]) in page


def test_template_admin_filters_by_kind_and_keeps_image_read_only(
    admin_client: Client, team: Team
) -> None:
    template = TemplateFactory.create(team=team, alias="py", image_id="base")
    TemplateFactory.create(team=team, kind=Template.Kind.SNAPSHOT)
    change = reverse("admin:templates_template_change", args=[template.pk])

    listed = admin_client.get(reverse("admin:templates_template_changelist"), {"kind": "template"})
    response = admin_client.post(
        change,
        {
            "alias": "py-renamed",
            "image_id": "something-else",
            "cpu_count": 4,
            "memory_mb": 1024,
            "disk_size_mb": 2048,
            "pids_max": 512,
        },
    )

    assert {t.pk for t in listed.context["cl"].queryset} >= {template.pk}
    assert all(t.kind == "template" for t in listed.context["cl"].queryset)
    assert response.status_code == 302, response.content.decode()[:2000]
    template.refresh_from_db()
    assert (template.alias, template.cpu_count, template.image_id) == ("py-renamed", 4, "base")
    assert admin_client.get(reverse("admin:templates_template_add")).status_code == 403


def test_creating_an_api_key_in_admin_shows_it_once(admin_client: Client, team: Team) -> None:
    response = admin_client.post(
        reverse("admin:e2bfacade_apikey_add"), {"team": team.pk, "name": "ops"}, follow=True
    )

    shown = [str(m) for m in response.context["messages"] if "New API key" in str(m)]
    assert len(shown) == 1
    key = ApiKey.objects.get(team=team, name="ops")
    raw = next(w for w in shown[0].split() if w.startswith(key.prefix))
    assert ApiKey.objects.resolve(raw) == key
    later = admin_client.get(reverse("admin:e2bfacade_apikey_change", args=[key.pk]))
    assert raw not in later.content.decode()


def test_a_record_whose_key_was_rotated_out_still_shows_its_page(
    admin_client: Client, team: Team
) -> None:
    record = _record(team, "rotated-key", "irotated", request_encrypted=b"not a fernet token")

    page = admin_client.get(reverse("admin:idempotency_idempotencyrecord_change", args=[record.pk]))

    assert page.status_code == 200
    assert "cannot be decrypted" in page.content.decode()


def test_a_sandbox_whose_template_was_deleted_still_lists_and_opens(
    admin_client: Client, team: Team
) -> None:
    template = TemplateFactory.create(team=team)
    sandbox = SandboxFactory.create(team=team, template=template, state=Sandbox.State.KILLED)
    template_id = template.pk
    template.delete()  # allowed once no live sandbox uses it; killed ones keep its id

    listed = admin_client.get(reverse("admin:sandboxes_sandbox_changelist"))
    page = admin_client.get(reverse("admin:sandboxes_sandbox_change", args=[sandbox.pk]))

    assert [s.pk for s in listed.context["cl"].queryset] == [sandbox.pk]
    assert page.status_code == 200
    assert f"{template_id} (deleted)" in page.content.decode()


def test_the_sandbox_list_costs_the_same_queries_for_one_row_or_many(
    admin_client: Client, team: Team, django_assert_max_num_queries: Any
) -> None:
    SandboxFactory.create_batch(20, team=team)
    url = reverse("admin:sandboxes_sandbox_changelist")
    admin_client.get(url)  # warm the session and content types

    with django_assert_max_num_queries(12):
        assert admin_client.get(url).status_code == 200
