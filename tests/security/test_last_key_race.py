"""Deleting a team's last two keys at once, through a live gunicorn (4 worker processes) on
PostgreSQL, each delete stalled between its check and its revoke (a failpoint): the team
row's lock orders the deletes, so exactly one answers 204, the other
400, and the team keeps exactly one key that still authenticates. And ``manage.py
create_access_token`` on that deployment prints a token its ``GET /teams`` accepts."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.support.live_process import Server
from tests.support.live_server import Deployment

ADMIN_TOKEN = secrets.token_hex(24)
ROUNDS = 5


@pytest.fixture(scope="module")
def deployment() -> Iterator[tuple[Deployment, Server]]:
    with Deployment(teams=ROUNDS, prefix="e2blk") as dep:
        # Each delete stalls 0.5 s between its "another key is left" check and its revoke:
        # without the team row's lock both deletes would pass the check, in every round.
        server = dep.server(
            workers=4,
            E2BFACADE_ADMIN_TOKEN=ADMIN_TOKEN,
            E2BFACADE_FAILPOINTS="api_key_delete.checked=sleep:0.5",
            E2BFACADE_FAILPOINT_DIR="",  # every request, not once
        )
        yield dep, server


def delete_at_once(server: Server, admin: dict[str, str], ids: list[str]) -> dict[str, int]:
    """DELETE each of ``ids`` from its own thread, released together: {id: status}."""
    barrier = threading.Barrier(len(ids))
    statuses: dict[str, int] = {}

    def delete(key_id: str) -> None:
        barrier.wait()
        response = httpx.delete(f"{server.url}/api-keys/{key_id}", headers=admin, timeout=30)
        statuses[key_id] = response.status_code

    threads = [threading.Thread(target=delete, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_concurrent_deletes_of_a_teams_last_two_keys_leave_exactly_one(
    deployment: tuple[Deployment, Server],
) -> None:
    dep, server = deployment
    for _ in range(ROUNDS):
        team = dep.take_team()
        admin = {"X-Admin-Token": ADMIN_TOKEN, "X-Team-ID": str(team.team_id)}
        made = httpx.post(
            f"{server.url}/admin/teams/{team.team_id}/api-keys",
            json={"name": "second"},
            headers=admin,
            timeout=30,
        )
        assert made.status_code == 201, made.text
        ids = [k["id"] for k in httpx.get(f"{server.url}/api-keys", headers=admin).json()]
        assert len(ids) == 2
        statuses = delete_at_once(server, admin, ids)

        assert sorted(statuses.values()) == [204, 400], statuses
        left = httpx.get(f"{server.url}/api-keys", headers=admin).json()
        assert [k["id"] for k in left] == [i for i, s in statuses.items() if s == 400]
        raws = {team.api_key, made.json()["key"]}
        working = [
            raw
            for raw in raws
            if httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-Key": raw}).status_code
            == 200
        ]
        assert len(working) == 1


def test_create_access_token_on_a_live_deployment_reads_its_team(
    deployment: tuple[Deployment, Server],
) -> None:
    dep, server = deployment
    team = dep.take_team()
    raw = dep.manage("create_access_token", str(team.team_id)).strip().splitlines()[-1]

    teams = httpx.get(f"{server.url}/teams", headers={"Authorization": f"Bearer {raw}"})
    keys = httpx.get(
        f"{server.url}/api-keys",
        headers={"Authorization": f"Bearer {raw}", "X-Team-ID": str(team.team_id)},
    )

    assert teams.status_code == 200, teams.text
    assert teams.json()[0]["teamID"] == str(team.team_id)
    assert keys.status_code == 200 and len(keys.json()) == 1
