"""A sandbox's logs and metrics through the API, against the real local runtime: what a
guest writes reaches the host and the database only within the bounds, another team sees
none of it, and the metrics routes read what the service recorded.

These are API tests living with the hostile-guest suite (a guest that floods its output is
an attack on the host): the Django-level fixtures of tests/api are used, not the driver
fixtures of this folder's conftest."""

from __future__ import annotations

import json
import resource
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from e2bfacade.models import Team
from e2bfacade.runtime import start as start_module
from e2bfacade.runtime.base import ImageBuild, StartCommand
from e2bfacade.runtime.local import LocalRuntime
from sandboxes import logs, usage
from sandboxes.models import Sandbox, SandboxLogEntry, TeamMetricSample
from templates.models import Template
from tests.api.conftest import (  # noqa: F401 - fixtures
    create_sandbox,
    other_api_key,
    other_client,
    other_team,
)
from tests.api.helpers import NOT_FOUND
from tests.support.factories import SandboxFactory
from tests.support.runtime_support import django_runtime, session_sandbox_root

CreateSandbox = Callable[..., dict[str, Any]]


@pytest.fixture(scope="session")
def sandbox_root() -> Iterator[Path]:
    yield from session_sandbox_root("e2bl-")


@pytest.fixture(autouse=True)
def runtime(settings: Any, sandbox_root: Path, db: None) -> Iterator[LocalRuntime]:
    # This folder's conftest gives the runtime per driver, for attacks made straight at a
    # driver; these go through the API, on the local runtime Django is configured with.
    yield from django_runtime(settings, sandbox_root)


def entries(client: APIClient, sandbox_id: str, **query: Any) -> list[dict[str, Any]]:
    response = client.get(f"/v2/sandboxes/{sandbox_id}/logs", query)
    assert response.status_code == 200, response.content
    found: list[dict[str, Any]] = response.json()["logs"]
    return found


def events(client: APIClient, sandbox_id: str) -> list[str]:
    return [
        e["fields"]["event"]
        for e in entries(client, sandbox_id)
        if e["fields"]["logger"] == "lifecycle"
    ]


def template_with_start(team: Team, runtime: LocalRuntime, start: StartCommand) -> Template:
    runtime.ensure_base_image()
    image = f"logs-{uuid.uuid4().hex[:8]}"
    runtime.build_image(
        ImageBuild(image_id=image, parent="base", populate=lambda root: None, start=start)
    )
    # No warm pool: the create runs the start command itself, while the test watches.
    return Template.objects.create(team=team, alias=f"t-{image}", image_id=image, warm_pool=0)


# ------------------------------------------------------------------------------- flood
def test_a_start_command_that_prints_endlessly_leaves_only_the_bounded_newest_lines(
    api_client: APIClient, runtime: LocalRuntime, team: Team, settings: Any
) -> None:
    settings.SANDBOX_LOG_MAX_ENTRIES = 200
    settings.SANDBOX_LOG_MAX_BYTES = 16 * 1024
    # Lines of ~200 bytes as fast as the guest can write them, and one line with no newline
    # at all at the start; the ready command lets the create answer after 3 s of it.
    flood = (
        "head -c 100000 /dev/zero | tr '\\0' x; echo; i=0; "
        "while :; do i=$((i+1)); echo \"flood $i $(printf '%0190d' 0)\"; done"
    )
    template = template_with_start(
        team,
        runtime,
        StartCommand(
            argv=("sh", "-c", flood),
            user="root",
            ready_argv=("sh", "-c", "sleep 3"),
            ready_timeout=30,
        ),
    )
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    created = api_client.post("/v2/sandboxes", {"templateID": template.alias}, format="json")

    assert created.status_code == 201, created.content
    sandbox_id = created.json()["sandboxID"]
    # The host keeps the runtime's bound on disk, whatever the guest wrote.
    kept_file = runtime.layout.sandbox_dir(sandbox_id) / start_module.OUTPUT_FILE
    assert kept_file.stat().st_size < 2 * start_module.BYTES_MAX
    # ... and no more than that in memory: 3 s of flood (hundreds of MB) left no trace.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 64 * 1024
    rows = SandboxLogEntry.objects.filter(sandbox_id=sandbox_id)
    assert rows.count() <= 200
    assert sum(rows.values_list("size", flat=True)) <= 16 * 1024
    got = entries(api_client, sandbox_id)
    assert got[-1]["fields"] == {"logger": "lifecycle", "event": "created"}
    # Whole lines only: the one being written when the follower stopped may be cut.
    numbers = [
        int(words[1])
        for words in (e["message"].split() for e in got)
        if len(words) == 3 and words[0] == "flood" and len(words[2]) == 190
    ]
    # The newest lines are kept, in order, none missing between them; the oldest went.
    assert len(numbers) > 20
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert numbers[-1] > 10 * len(numbers), "the guest wrote far more than was kept"
    assert not any(e["message"].startswith("xxx") for e in got)
    assert all(len(e["message"]) <= logs.MESSAGE_MAX for e in got)


def test_a_start_command_that_fails_its_cold_boot_is_logged_with_its_output(
    api_client: APIClient, runtime: LocalRuntime, team: Team
) -> None:
    # Ready on the first boot; the file it leaves on the sandbox's disk makes the next boot
    # (a cold boot, after a pause that kept only the files) fail.
    script = (
        "echo booting; if [ -f /home/user/booted ]; then touch /home/user/again; "
        "echo 'refusing a second boot' >&2; exit 3; fi; touch /home/user/booted; exec sleep 600"
    )
    template = template_with_start(
        team,
        runtime,
        StartCommand(
            argv=("sh", "-c", script),
            user="root",
            ready_argv=(
                "sh",
                "-c",
                "sleep 1; [ -f /home/user/booted ] && [ ! -f /home/user/again ]",
            ),
            ready_timeout=10,
        ),
    )
    created = api_client.post("/v2/sandboxes", {"templateID": template.alias}, format="json")
    assert created.status_code == 201, created.content
    sandbox_id = created.json()["sandboxID"]
    paused = api_client.post(f"/sandboxes/{sandbox_id}/pause", {"memory": False}, format="json")
    assert paused.status_code in (204, 400), paused.content
    if paused.status_code == 400:
        pytest.skip("this driver cannot drop a sandbox's memory on pause")

    resumed = api_client.post(f"/sandboxes/{sandbox_id}/resume", {}, format="json")

    assert resumed.status_code >= 400, resumed.content
    got = entries(api_client, sandbox_id)
    texts = [(e["fields"]["logger"], e["level"], e["message"]) for e in got]
    assert ("start", "info", "booting") in texts
    assert ("start", "error", "refusing a second boot") in texts
    assert got[-1]["level"] == "error" and got[-1]["fields"]["event"] == "resume_failed"
    assert "refusing a second boot" in got[-1]["message"]


# ---------------------------------------------------------------------------- lifecycle
def test_lifecycle_events_are_logged_and_kept_after_the_kill(
    api_client: APIClient,
    create_sandbox: CreateSandbox,  # noqa: F811 - fixture
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]
    assert api_client.post(f"/sandboxes/{sandbox_id}/pause", {}, format="json").status_code == 204
    assert api_client.post(f"/sandboxes/{sandbox_id}/resume", {}, format="json").status_code == 201
    assert api_client.delete(f"/sandboxes/{sandbox_id}").status_code == 204

    assert events(api_client, sandbox_id) == ["created", "paused", "resumed", "killed"]
    v1 = api_client.get(f"/sandboxes/{sandbox_id}/logs")
    assert v1.status_code == 200, v1.content
    body = v1.json()
    assert set(body) == {"logs", "logEntries"}
    lines = [json.loads(log["line"]) for log in body["logs"]]
    # What E2B's CLI reads of each line: its level and logger, then the rest.
    assert [line["level"] for line in lines] == ["info"] * 4
    assert {line["logger"] for line in lines} == {"lifecycle"}
    assert "paused at the caller's request" in lines[1]["message"]
    assert [log["timestamp"] for log in body["logs"]] == [
        e["timestamp"] for e in body["logEntries"]
    ]


def test_a_timeout_is_logged_as_the_reason_of_the_kill(
    api_client: APIClient,
    create_sandbox: CreateSandbox,  # noqa: F811 - fixture
) -> None:
    from sandboxes import worker

    sandbox_id = create_sandbox(timeout=60)["sandboxID"]
    Sandbox.objects.filter(pk=sandbox_id).update(end_at=timezone.now() - timedelta(seconds=1))

    assert worker.sandbox_expire(sandbox_id=sandbox_id) == "killed"

    last = entries(api_client, sandbox_id)[-1]
    assert last["fields"]["event"] == "killed"
    assert "timeout" in last["message"]


# ----------------------------------------------------------------------------- tenancy
def test_another_teams_sandbox_logs_are_a_404_in_e2bs_shape(
    create_sandbox: CreateSandbox,  # noqa: F811 - fixture
    other_client: APIClient,  # noqa: F811 - fixture
) -> None:
    sandbox_id = create_sandbox()["sandboxID"]

    for path in (f"/sandboxes/{sandbox_id}/logs", f"/v2/sandboxes/{sandbox_id}/logs"):
        response = other_client.get(path)
        assert response.status_code == 404, (path, response.content)
        assert response.json() == {"code": 404, "message": NOT_FOUND.format(sandbox_id)}


def test_logs_of_a_sandbox_killed_longer_ago_than_the_retention_are_purged(
    api_client: APIClient, team: Team, settings: Any
) -> None:
    now = timezone.now()
    old = SandboxFactory.create(team=team, state=Sandbox.State.KILLED, killed_at=now)
    logs.sandbox_log_event(old.sandbox_id, "killed", event="killed")
    assert api_client.get(f"/v2/sandboxes/{old.sandbox_id}/logs").status_code == 200

    later = now + timedelta(seconds=settings.SANDBOX_LOG_RETENTION_SECONDS + 1)
    assert logs.sandbox_log_purge(now=later) == 1
    Sandbox.objects.filter(pk=old.pk).update(killed_at=now - (later - now))
    assert api_client.get(f"/v2/sandboxes/{old.sandbox_id}/logs").status_code == 404


# -------------------------------------------------------------------------- the store
@pytest.mark.both_databases
def test_the_store_drops_the_oldest_entries_past_the_count_and_byte_bounds(
    team: Team, settings: Any
) -> None:
    settings.SANDBOX_LOG_MAX_ENTRIES = 10
    settings.SANDBOX_LOG_MAX_BYTES = 1000
    sandbox = SandboxFactory.create(team=team)
    base = timezone.now()

    def line(i: int, size: int = 10) -> logs.LogLine:
        return logs.LogLine(base + timedelta(milliseconds=i), "info", "start", f"{i:0{size}d}")

    logs.sandbox_log_append(sandbox_id=sandbox.pk, lines=[line(i) for i in range(8)])
    logs.sandbox_log_append(sandbox_id=sandbox.pk, lines=[line(i) for i in range(8, 16)])
    kept = list(SandboxLogEntry.objects.filter(sandbox=sandbox).order_by("timestamp"))
    assert [int(e.message) for e in kept] == list(range(6, 16))  # by count

    logs.sandbox_log_append(sandbox_id=sandbox.pk, lines=[line(16, 495), line(17, 495)])
    kept = list(SandboxLogEntry.objects.filter(sandbox=sandbox).order_by("timestamp"))
    assert [int(e.message) for e in kept] == [15, 16, 17]  # by bytes: 10 + 495 + 495

    # One batch far over the bounds: only its newest that fit are written at all, and they
    # push out everything older.
    written = logs.sandbox_log_append(
        sandbox_id=sandbox.pk, lines=[line(i, 333) for i in range(100, 10_000)]
    )
    kept = list(SandboxLogEntry.objects.filter(sandbox=sandbox).order_by("timestamp"))
    assert written == 3
    assert [int(e.message) for e in kept] == [9997, 9998, 9999]


def test_v2_filters_by_level_search_direction_and_cursor(api_client: APIClient, team: Team) -> None:
    sandbox = SandboxFactory.create(team=team)
    base = timezone.now().replace(microsecond=0)
    levels = ["debug", "info", "warn", "error"]
    logs.sandbox_log_append(
        sandbox_id=sandbox.pk,
        lines=[
            logs.LogLine(base + timedelta(seconds=i), levels[i % 4], "start", f"line {i} Word")
            for i in range(8)
        ],
    )
    sid = sandbox.pk
    cursor = int((base + timedelta(seconds=5)).timestamp() * 1000)

    def messages(**query: Any) -> list[str]:
        return [e["message"] for e in entries(api_client, sid, **query)]

    assert messages(level="warn") == ["line 2 Word", "line 3 Word", "line 6 Word", "line 7 Word"]
    assert messages(search="line 1") == ["line 1 Word"]
    assert messages(search="word") == []  # case-sensitive, as E2B's
    assert messages(cursor=cursor) == ["line 5 Word", "line 6 Word", "line 7 Word"]
    assert messages(cursor=cursor, direction="backward", limit=2) == ["line 5 Word", "line 4 Word"]
    assert messages(limit=0) == []
    v1 = api_client.get(f"/sandboxes/{sid}/logs", {"start": cursor, "limit": 1}).json()
    assert [json.loads(x["line"])["message"] for x in v1["logs"]] == ["line 5 Word"]


@pytest.mark.parametrize(
    "path,query,says",
    [
        ("/v2/sandboxes/{}/logs", {"limit": "many"}, "'limit' must be an integer"),
        ("/v2/sandboxes/{}/logs", {"limit": "1001"}, "'limit' must be between 0 and 1000"),
        ("/v2/sandboxes/{}/logs", {"cursor": "-1"}, "'cursor' must be at least 0"),
        ("/v2/sandboxes/{}/logs", {"direction": "up"}, "'direction' must be forward"),
        ("/v2/sandboxes/{}/logs", {"level": "fatal"}, "'level' must be one of"),
        ("/v2/sandboxes/{}/logs", {"search": "x" * 257}, "'search' must be at most 256"),
        ("/sandboxes/{}/logs", {"start": "soon"}, "'start' must be an integer"),
    ],
)
def test_a_bad_logs_query_is_a_400_naming_the_parameter(
    api_client: APIClient, team: Team, path: str, query: dict[str, str], says: str
) -> None:
    sandbox = SandboxFactory.create(team=team)
    response = api_client.get(path.format(sandbox.pk), query)
    assert response.status_code == 400, response.content
    assert says in response.json()["message"]


def test_a_cursor_past_any_date_is_an_empty_page_not_a_500(
    api_client: APIClient, team: Team
) -> None:
    sandbox = SandboxFactory.create(team=team)
    logs.sandbox_log_event(sandbox.pk, "created", event="created")
    assert entries(api_client, sandbox.pk, cursor=10**30) == []
    assert len(entries(api_client, sandbox.pk, cursor=10**30, direction="backward")) == 1


# ----------------------------------------------------------------------------- metrics
def test_batch_metrics_answers_the_teams_live_sandboxes_from_one_query(
    api_client: APIClient,
    create_sandbox: CreateSandbox,  # noqa: F811 - fixture
    other_client: APIClient,  # noqa: F811 - fixture
) -> None:
    mine = [create_sandbox()["sandboxID"] for _ in range(2)]
    theirs = create_sandbox(client=other_client)["sandboxID"]
    ids = ",".join([*mine, theirs, "inosuchsandbox0000000", mine[0]])

    with CaptureQueriesContext(connection) as queries:
        response = api_client.get("/sandboxes/metrics", {"sandbox_ids": ids})

    assert response.status_code == 200, response.content
    found = response.json()["sandboxes"]
    assert sorted(found) == sorted(mine)
    for metric in found.values():
        assert metric["cpuCount"] > 0 and metric["memTotal"] > 0 and metric["timestampUnix"] > 0
    sandbox_reads = [q for q in queries.captured_queries if '"sandboxes_sandbox"' in q["sql"]]
    assert len(sandbox_reads) == 1, sandbox_reads


@pytest.mark.parametrize(
    "query,says",
    [
        ({}, "sandbox_ids is required"),
        ({"sandbox_ids": " , "}, "sandbox_ids is required"),
        ({"sandbox_ids": ",".join(f"i{n}" for n in range(101))}, "at most 100"),
    ],
)
def test_batch_metrics_refuses_no_ids_or_more_than_100(
    api_client: APIClient, query: dict[str, str], says: str
) -> None:
    response = api_client.get("/sandboxes/metrics", query)
    assert response.status_code == 400, response.content
    assert says in response.json()["message"]


@pytest.mark.both_databases
def test_team_metrics_count_the_starts_and_the_most_live_for_the_callers_team_only(
    api_client: APIClient,
    create_sandbox: CreateSandbox,  # noqa: F811 - fixture
    team: Team,
    other_team: Team,  # noqa: F811 - fixture
    settings: Any,
) -> None:
    settings.TEAM_METRICS_STEP_SECONDS = 3600  # every start of this test in one step
    start = int(timezone.now().timestamp())
    created = [create_sandbox()["sandboxID"] for _ in range(3)]
    assert api_client.delete(f"/sandboxes/{created[0]}").status_code == 204
    usage.team_metrics_sample(now=timezone.now())

    with CaptureQueriesContext(connection) as queries:
        response = api_client.get(f"/teams/{team.pk}/metrics", {"start": start})
    assert response.status_code == 200, response.content
    points = response.json()
    assert sum(p["concurrentSandboxes"] for p in points) == 3  # the most live at once
    assert sum(p["sandboxStartRate"] for p in points) == pytest.approx(3 / 3600)
    assert set(points[0]) == {
        "timestamp",
        "timestampUnix",
        "concurrentSandboxes",
        "sandboxStartRate",
    }
    # Read from the samples, never from the sandbox rows.
    assert not [q for q in queries.captured_queries if '"sandboxes_sandbox"' in q["sql"]]
    assert TeamMetricSample.objects.filter(team=team).count() == 1

    most = api_client.get(
        f"/teams/{team.pk}/metrics/max", {"start": str(start), "metric": "concurrent_sandboxes"}
    )
    assert most.status_code == 200, most.content
    assert most.json()["value"] == 3
    rate = api_client.get(
        f"/teams/{team.pk}/metrics/max", {"start": str(start), "metric": "sandbox_start_rate"}
    )
    assert rate.json()["value"] == pytest.approx(3 / 3600)

    for path in (f"/teams/{other_team.pk}/metrics", f"/teams/{other_team.pk}/metrics/max"):
        refused = api_client.get(path, {"metric": "concurrent_sandboxes"})
        assert refused.status_code == 403, refused.content
        assert refused.json()["code"] == 403
    bad = api_client.get(f"/teams/{team.pk}/metrics/max", {"metric": "cpu"})
    assert bad.status_code == 400 and "'metric' must be one of" in bad.json()["message"]
    backwards = api_client.get(f"/teams/{team.pk}/metrics", {"start": 10, "end": 5})
    assert backwards.status_code == 400


@pytest.mark.both_databases
def test_old_team_samples_are_purged(team: Team, settings: Any) -> None:
    now = timezone.now()
    TeamMetricSample.objects.create(team=team, at=int(now.timestamp()) - 10, concurrent=1)
    later = now + timedelta(seconds=settings.TEAM_METRICS_RETENTION_SECONDS + 60)
    assert usage.team_metrics_purge(now=later) == 1


def test_the_limits_a_sandbox_meets_are_logged_once_each(
    api_client: APIClient, api_key: Any, runtime: LocalRuntime
) -> None:
    """A process killed at the memory limit and forks refused at the pids limit are read
    from the sandbox's counters by the worker and logged once; a second look logs nothing."""
    from sandboxes.worker import sandbox_log_limits
    from tests.runtime.helpers import sh
    from tests.support.factories import TemplateFactory

    TemplateFactory.create(
        team=api_key.team, alias="tight", image_id="base", memory_mb=128, pids_max=64
    )
    response = api_client.post("/v2/sandboxes", {"templateID": "tight"}, format="json")
    assert response.status_code == 201, response.content
    sandbox_id = response.json()["sandboxID"]
    assert sandbox_log_limits() == []  # nothing met yet
    # 512 MiB asked of a 128 MiB sandbox: the kernel kills the process.
    hog = sh(runtime, sandbox_id, "python3 -c 'b = bytearray(512 << 20); print(len(b))'")
    assert hog.exit_code != 0
    # More processes than its pids limit: forks are refused (the shell reports them).
    sh(runtime, sandbox_id, "for i in $(seq 100); do sleep 3 & done; wait", timeout=60)
    assert sandbox_log_limits() == [sandbox_id, sandbox_id]
    assert sandbox_log_limits() == []  # the same counts: logged once
    found = {e["fields"]["event"]: e for e in entries(api_client, sandbox_id)}
    assert found["oom"]["level"] == "error" and "out of memory" in found["oom"]["message"]
    assert found["pid_limit"]["level"] == "warn"
    assert "pid limit reached" in found["pid_limit"]["message"]
