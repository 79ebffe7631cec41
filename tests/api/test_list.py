"""GET /v2/sandboxes (filters, order, keyset paging with signed tokens) and GET /sandboxes
(v1: running only, no paging). Rows come from factories: a list reads the database only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from e2bfacade.models import Team
from sandboxes.models import Sandbox
from tests.api.helpers import assert_error
from tests.support.factories import SandboxFactory, TemplateFactory

pytestmark = pytest.mark.both_databases

State = Sandbox.State
LISTED_FIELDS = {
    "templateID",
    "sandboxID",
    "clientID",
    "startedAt",
    "endAt",
    "cpuCount",
    "memoryMB",
    "diskSizeMB",
    "state",
    "envdVersion",
    "alias",
    "metadata",
}


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [s["sandboxID"] for s in response.json()]


@pytest.fixture
def one_of_each_state(team: Team) -> dict[str, Sandbox]:
    now = timezone.now()
    return {
        state: SandboxFactory.create(team=team, state=state, started_at=now - timedelta(seconds=i))
        for i, state in enumerate(State)
    }


def test_list_shows_live_sandboxes_in_their_wire_state_and_in_the_listed_shape(
    api_client: APIClient, one_of_each_state: dict[str, Sandbox]
) -> None:
    response = api_client.get("/v2/sandboxes")

    listed = {s["sandboxID"]: s for s in response.json()}
    expected = {
        one_of_each_state[State.RUNNING].pk: "running",
        one_of_each_state[State.RESUMING].pk: "running",
        one_of_each_state[State.PAUSED].pk: "paused",
        one_of_each_state[State.PAUSING].pk: "paused",
    }
    assert {k: v["state"] for k, v in listed.items()} == expected  # no creating, killing, killed
    for sandbox in listed.values():
        assert set(sandbox) == LISTED_FIELDS


@pytest.mark.parametrize(
    ("state_param", "expected"),
    [
        ("running", {State.RUNNING, State.RESUMING}),
        ("paused", {State.PAUSED, State.PAUSING}),
        ("running,paused", {State.RUNNING, State.RESUMING, State.PAUSED, State.PAUSING}),
        ("paused, running", {State.RUNNING, State.RESUMING, State.PAUSED, State.PAUSING}),
    ],
)
def test_list_filters_by_state(
    api_client: APIClient,
    one_of_each_state: dict[str, Sandbox],
    state_param: str,
    expected: set[str],
) -> None:
    response = api_client.get("/v2/sandboxes", {"state": state_param})

    assert set(ids(response)) == {one_of_each_state[s].pk for s in expected}


@pytest.mark.parametrize("state_param", ["killed", "creating", "running,bogus"])
def test_list_refuses_an_unknown_state(api_client: APIClient, state_param: str) -> None:
    assert (
        "state"
        in assert_error(api_client.get("/v2/sandboxes", {"state": state_param}), 400)["message"]
    )


def test_list_filters_by_metadata_given_as_one_url_encoded_parameter(
    api_client: APIClient, team: Team
) -> None:
    match = SandboxFactory.create(team=team, metadata={"env": "prod", "tier": "a", "x": "1"})
    SandboxFactory.create(team=team, metadata={"env": "prod", "tier": "b"})
    SandboxFactory.create(team=team, metadata={"env": "dev", "tier": "a"})
    SandboxFactory.create(team=team, metadata={})
    tricky = SandboxFactory.create(team=team, metadata={"path": "a=b&c d", "env": "prod"})

    # The SDK url-encodes "k=v&k2=v2" into the one `metadata` parameter; so does APIClient.
    both = api_client.get("/v2/sandboxes", {"metadata": "env=prod&tier=a"})
    escaped = api_client.get("/v2/sandboxes", {"metadata": urlencode({"path": "a=b&c d"})})
    v1 = api_client.get("/sandboxes", {"metadata": "env=prod&tier=a"})

    assert ids(both) == [match.pk]
    assert ids(escaped) == [tricky.pk]
    assert ids(v1) == [match.pk]


def test_a_metadata_filter_compares_values_as_plain_strings(
    api_client: APIClient, team: Team
) -> None:
    plain = SandboxFactory.create(team=team, metadata={"env": "prod", "n": "1"})

    assert ids(api_client.get("/v2/sandboxes", {"metadata": "n=1"})) == [plain.pk]
    assert ids(api_client.get("/v2/sandboxes", {"metadata": 'env="prod"'})) == []
    assert ids(api_client.get("/v2/sandboxes", {"metadata": "env=pro"})) == []
    assert ids(api_client.get("/v2/sandboxes", {"metadata": "missing=prod"})) == []


def test_list_refuses_a_malformed_metadata_filter(api_client: APIClient) -> None:
    assert_error(api_client.get("/v2/sandboxes", {"metadata": "no-equals-sign"}), 400)


def test_list_filters_by_template_id_or_alias(api_client: APIClient, team: Team) -> None:
    python = TemplateFactory.create(team=team, alias="python")
    in_python = SandboxFactory.create(team=team, template=python)
    SandboxFactory.create(team=team)

    assert ids(api_client.get("/v2/sandboxes", {"template": "python"})) == [in_python.pk]
    assert ids(api_client.get("/v2/sandboxes", {"template": python.pk})) == [in_python.pk]
    assert ids(api_client.get("/v2/sandboxes", {"template": "nope"})) == []


def test_list_filters_by_started_after(api_client: APIClient, team: Team) -> None:
    t0 = timezone.now().replace(microsecond=0) - timedelta(hours=1)
    rows = [
        SandboxFactory.create(team=team, started_at=t0 + timedelta(seconds=10 * i))
        for i in range(3)
    ]

    after = (t0 + timedelta(seconds=5)).isoformat()  # "+00:00": APIClient encodes the '+'
    zulu = (t0 + timedelta(seconds=15)).strftime("%Y-%m-%dT%H:%M:%SZ")

    assert ids(api_client.get("/v2/sandboxes", {"startedAfter": after})) == [rows[2].pk, rows[1].pk]
    assert ids(api_client.get("/v2/sandboxes", {"startedAfter": zulu})) == [rows[2].pk]
    # A '+' sent unencoded arrives as a space; it is still read as the offset.
    unencoded = api_client.get(f"/v2/sandboxes?startedAfter={after}")
    assert ids(unencoded) == [rows[2].pk, rows[1].pk]


@pytest.mark.parametrize("value", ["yesterday", "2024-01-01T00:00:00"])
def test_list_refuses_a_started_after_that_is_not_rfc3339(
    api_client: APIClient, value: str
) -> None:
    assert (
        "startedAfter"
        in assert_error(api_client.get("/v2/sandboxes", {"startedAfter": value}), 400)["message"]
    )


def test_list_orders_by_start_newest_first_by_default_or_oldest_first(
    api_client: APIClient, team: Team
) -> None:
    t0 = timezone.now() - timedelta(hours=1)
    rows = [
        SandboxFactory.create(team=team, started_at=t0 + timedelta(minutes=i)) for i in range(4)
    ]
    oldest_first = [r.pk for r in rows]

    assert ids(api_client.get("/v2/sandboxes")) == oldest_first[::-1]
    assert ids(api_client.get("/v2/sandboxes", {"order": "desc"})) == oldest_first[::-1]
    assert ids(api_client.get("/v2/sandboxes", {"order": "asc"})) == oldest_first
    assert_error(api_client.get("/v2/sandboxes", {"order": "up"}), 400)


@pytest.mark.parametrize("limit", ["0", "101", "-1", "ten", "1.5"])
def test_list_refuses_a_limit_outside_1_to_100(api_client: APIClient, limit: str) -> None:
    assert (
        "limit" in assert_error(api_client.get("/v2/sandboxes", {"limit": limit}), 400)["message"]
    )


@pytest.mark.parametrize("limit", ["1", "100"])
def test_list_accepts_the_limit_bounds(api_client: APIClient, team: Team, limit: str) -> None:
    SandboxFactory.create(team=team)

    assert len(ids(api_client.get("/v2/sandboxes", {"limit": limit}))) == 1


def collect_pages(client: APIClient, params: dict[str, str]) -> tuple[list[list[str]], list[str]]:
    """Follow X-Next-Token to the end: the ids of each page and the tokens seen."""
    pages: list[list[str]] = []
    tokens: list[str] = []
    token: str | None = None
    while True:
        response = client.get(
            "/v2/sandboxes", {**params, **({"nextToken": token} if token else {})}
        )
        pages.append(ids(response))
        token = response.headers.get("X-Next-Token")
        if token is None:
            return pages, tokens
        tokens.append(token)
        assert len(pages) < 10, "paging does not end"


@pytest.fixture
def seven(team: Team) -> list[Sandbox]:
    """Seven sandboxes, three of which started at the same instant (ties break by id)."""
    t0 = timezone.now() - timedelta(hours=1)
    starts = [
        t0,
        t0 + timedelta(seconds=1),
        t0 + timedelta(seconds=1),
        t0 + timedelta(seconds=1),
        t0 + timedelta(seconds=2),
        t0 + timedelta(seconds=3),
        t0 + timedelta(seconds=4),
    ]
    return [SandboxFactory.create(team=team, started_at=s) for s in starts]


@pytest.mark.parametrize("order", ["desc", "asc"])
def test_paging_seven_sandboxes_three_at_a_time_sees_each_exactly_once(
    api_client: APIClient, seven: list[Sandbox], order: str
) -> None:
    pages, tokens = collect_pages(api_client, {"limit": "3", "order": order})

    assert [len(p) for p in pages] == [3, 3, 1]
    assert len(tokens) == 2  # no X-Next-Token on the last page
    flat = [sandbox_id for page in pages for sandbox_id in page]
    assert sorted(flat) == sorted(s.pk for s in seven)
    assert flat == ids(api_client.get("/v2/sandboxes", {"order": order}))


def test_a_page_that_ends_exactly_at_the_last_sandbox_has_no_next_token(
    api_client: APIClient, team: Team
) -> None:
    for _ in range(3):
        SandboxFactory.create(team=team)

    response = api_client.get("/v2/sandboxes", {"limit": "3"})

    assert len(ids(response)) == 3
    assert "X-Next-Token" not in response.headers


def test_paging_is_stable_while_sandboxes_come_and_go(
    api_client: APIClient, team: Team, seven: list[Sandbox]
) -> None:
    first = api_client.get("/v2/sandboxes", {"limit": "3"})
    SandboxFactory.create(team=team)  # newest: sorts before the cursor, never seen on page 2
    Sandbox.objects.filter(pk=ids(first)[0]).update(state=State.KILLED)

    second = api_client.get(
        "/v2/sandboxes", {"limit": "3", "nextToken": first.headers["X-Next-Token"]}
    )

    assert set(ids(second)).isdisjoint(ids(first))
    assert (
        ids(second)
        == [s.pk for s in sorted(seven, key=lambda s: (s.started_at, s.pk), reverse=True)][3:6]
    )


def test_a_tampered_token_is_refused(api_client: APIClient, seven: list[Sandbox]) -> None:
    token = api_client.get("/v2/sandboxes", {"limit": "3"}).headers["X-Next-Token"]
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")

    for bad in (tampered, "garbage", token + "x"):
        response = api_client.get("/v2/sandboxes", {"limit": "3", "nextToken": bad})
        assert "nextToken" in assert_error(response, 400)["message"]


@pytest.mark.parametrize(
    "other_filters",
    [
        {"state": "running"},
        {"order": "asc"},
        {"metadata": "a=b"},
        {"template": "base"},
        {"startedAfter": "2000-01-01T00:00:00Z"},
    ],
)
def test_a_token_reused_with_other_filters_is_refused(
    api_client: APIClient, seven: list[Sandbox], other_filters: dict[str, str]
) -> None:
    token = api_client.get("/v2/sandboxes", {"limit": "3"}).headers["X-Next-Token"]

    response = api_client.get("/v2/sandboxes", {"limit": "3", "nextToken": token, **other_filters})

    assert_error(response, 400)


def test_a_token_may_be_used_with_another_limit(
    api_client: APIClient, seven: list[Sandbox]
) -> None:
    token = api_client.get("/v2/sandboxes", {"limit": "3"}).headers["X-Next-Token"]

    assert len(ids(api_client.get("/v2/sandboxes", {"limit": "10", "nextToken": token}))) == 4


def test_v1_list_shows_running_sandboxes_only_and_does_not_page(
    api_client: APIClient, one_of_each_state: dict[str, Sandbox], team: Team
) -> None:
    extra = [SandboxFactory.create(team=team) for _ in range(101)]

    response = api_client.get("/sandboxes", {"limit": "1", "state": "paused"})

    assert response.status_code == 200
    assert "X-Next-Token" not in response.headers
    expected = {one_of_each_state[State.RUNNING].pk, one_of_each_state[State.RESUMING].pk}
    assert set(ids(response)) == expected | {s.pk for s in extra}
    assert {s["state"] for s in response.json()} == {"running"}


@pytest.mark.parametrize(
    "value", ["0323-02-14T19:45:50-17:08", "2026-01-01T00:00:00+23:59", "0001-01-01T00:00:00+01:00"]
)
def test_started_after_with_any_rfc3339_offset_is_answered_not_crashed(
    api_client: APIClient, value: str
) -> None:
    response = api_client.get("/v2/sandboxes", {"startedAfter": value})

    assert response.status_code in (200, 400)
    assert response.json() == [] or response.json()["code"] == 400
