"""``PATCH /templates/{id}`` and ``/v2/templates/{id}`` (``public``), what ``e2b template
publish``/``unpublish`` call, with E2B's visibility rules: another team may start a
published template (by its id) and never publish, tag, delete or build on it. And
``GET /v2/templates``, E2B's paged list. Through the whole Django stack, sandboxes started
on the real local runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from e2bfacade.models import ApiKey, Team
from e2bfacade.runtime.local import LocalRuntime
from templates.builds import bases
from templates.models import Template
from tests.support.factories import ApiKeyFactory, TeamFactory, TemplateFactory
from tests.support.runtime_support import django_runtime, session_sandbox_root


@pytest.fixture(scope="session")
def sandbox_root() -> Iterator[Path]:
    yield from session_sandbox_root("e2bp-")


@pytest.fixture
def runtime(settings: Any, sandbox_root: Path, db: None) -> Iterator[LocalRuntime]:
    yield from django_runtime(settings, sandbox_root)


@pytest.fixture
def template(team: Team) -> Template:
    return TemplateFactory.create(team=team)


@pytest.fixture
def other_client(db: None) -> APIClient:
    key: ApiKey = ApiKeyFactory.create(team=TeamFactory.create(name="other"))
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=key.raw)  # type: ignore[attr-defined]
    return client


def create(client: APIClient, template_id: str) -> Any:
    return client.post("/v2/sandboxes", {"templateID": template_id}, format="json")


def test_a_published_template_is_started_by_another_team_until_it_is_unpublished(
    runtime: LocalRuntime, api_client: APIClient, other_client: APIClient, template: Template
) -> None:
    before = create(other_client, template.template_id)

    published = api_client.patch(f"/v2/templates/{template.alias}", {"public": True}, format="json")
    started = create(other_client, template.template_id)
    by_alias = create(other_client, str(template.alias))
    unpublished = api_client.patch(
        f"/v2/templates/{template.template_id}", {"public": False}, format="json"
    )
    after = create(other_client, template.template_id)

    assert before.status_code == 404, before.content
    assert published.status_code == 200, published.content
    assert published.json() == {"names": [template.alias]}
    assert started.status_code == 201, started.content
    assert started.json()["templateID"] == template.template_id
    # Aliases are unique per team only: another team's is never resolved by its name.
    assert by_alias.status_code == 404, by_alias.content
    assert unpublished.status_code == 200, unpublished.content
    assert after.status_code == 404, after.content


def test_another_team_can_never_publish_tag_delete_or_build_on_a_published_template(
    api_client: APIClient, other_client: APIClient, template: Template
) -> None:
    api_client.patch(f"/templates/{template.template_id}", {"public": True}, format="json")
    tid = template.template_id
    other = Team.objects.get(name="other")

    for response in (
        other_client.patch(f"/v2/templates/{tid}", {"public": False}, format="json"),
        other_client.patch(f"/templates/{tid}", {"public": False}, format="json"),
        other_client.delete(f"/templates/{tid}"),
        other_client.post("/templates/tags", {"target": tid, "tags": ["x"]}, format="json"),
    ):
        assert response.status_code in (403, 404), response.content
        assert response.json()["code"] == response.status_code
    with pytest.raises(bases.BaseUnavailable):
        bases.resolve(team_id=other.pk, spec={"fromTemplate": tid}, auth=None)
    template.refresh_from_db()
    assert template.public is True


def test_the_v1_patch_answers_200_with_no_body_and_the_list_shows_it_public(
    api_client: APIClient, template: Template
) -> None:
    response = api_client.patch(
        f"/templates/{template.template_id}", {"public": True}, format="json"
    )

    assert response.status_code == 200, response.content
    assert response.content == b""
    listed = {t["templateID"]: t for t in api_client.get("/templates").json()}
    assert listed[template.template_id]["public"] is True


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v2/templates/base", {"public": False}, 403),
        ("/v2/templates/no-such-template", {"public": True}, 404),
        ("/v2/templates/{tid}", {"public": "yes"}, 400),
        ("/v2/templates/{tid}", ["public"], 400),
    ],
)
def test_bad_publish_requests_answer_a_4xx_in_e2bs_shape(
    api_client: APIClient, template: Template, path: str, body: Any, status: int
) -> None:
    response = api_client.patch(path.format(tid=template.template_id), body, format="json")

    assert response.status_code == status, response.content
    assert response.json()["code"] == status
    template.refresh_from_db()
    assert template.public is False


def test_v2_templates_lists_a_page_at_a_time(api_client: APIClient, team: Team) -> None:
    mine = [TemplateFactory.create(team=team).template_id for _ in range(3)]
    TemplateFactory.create(team=TeamFactory.create())  # another team's: never listed

    seen: list[str] = []
    token = None
    for _ in range(10):
        query: dict[str, str] = {"limit": "2", **({"nextToken": token} if token else {})}
        page = api_client.get("/v2/templates", query)
        assert page.status_code == 200, page.content
        seen += [t["templateID"] for t in page.json()]
        token = page.headers.get("X-Next-Token")
        if token is None:
            break

    assert seen == ["base", *mine]
    assert api_client.get("/v2/templates", {"teamID": "999999"}).status_code == 404
    assert api_client.get("/v2/templates", {"teamID": str(team.pk)}).status_code == 200
    assert api_client.get("/v2/templates", {"limit": 0}).status_code == 400
    assert api_client.get("/v2/templates", {"nextToken": "forged"}).status_code == 400
