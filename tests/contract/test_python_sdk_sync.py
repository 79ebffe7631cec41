"""The synchronous Python SDK (``e2b.Sandbox``, pinned e2b==2.63.0) against a live server.

Every SDK method that maps to a control-plane route is driven here exactly as a user calls
it; what the SDK hides (statuses, headers, body shapes) is checked in test_http_wire.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from e2b import (
    AuthenticationException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)
from packaging.version import Version

from tests.support.live_server import LiveServer
from tests.support.waiting import eventually

# Clock slack between the server's "now" and ours (same machine) plus request latency.
SLACK = timedelta(seconds=3)

MakeSandbox = Callable[..., Sandbox]


def seconds(delta: timedelta) -> float:
    return delta.total_seconds()


def list_all(query: SandboxQuery, **kwargs: object) -> list[str]:
    """Every sandbox id the paginator yields, page after page."""
    paginator = Sandbox.list(query=query, **kwargs)  # type: ignore[arg-type]
    ids: list[str] = []
    while paginator.has_next:
        ids += [s.sandbox_id for s in paginator.next_items()]
    return ids


# ------------------------------------------------------------------------------- create
@pytest.mark.sqlite_smoke
def test_create_without_arguments_starts_a_running_base_sandbox_for_300_seconds(
    sdk_env: LiveServer, kill_later: Callable[[str], str]
) -> None:
    sandbox = Sandbox.create()
    kill_later(sandbox.sandbox_id)

    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.template_id == "base"
    assert info.state == SandboxState.RUNNING
    assert info.metadata == {}
    assert seconds(info.end_at - info.started_at) == pytest.approx(300, abs=1)


def test_create_records_timeout_metadata_and_accepts_envs(
    make_sandbox: MakeSandbox, tag: str
) -> None:
    before = datetime.now(UTC)
    sandbox = make_sandbox(
        timeout=60, metadata={"tag": tag, "owner": "contract"}, envs={"GREETING": "hello"}
    )

    info = sandbox.get_info()
    assert info.metadata == {"tag": tag, "owner": "contract"}
    assert before - SLACK <= info.started_at <= datetime.now(UTC) + SLACK
    assert seconds(info.end_at - info.started_at) == pytest.approx(60, abs=1)


def test_create_from_an_unknown_template_raises_an_error_naming_the_template(
    sdk_env: LiveServer,
) -> None:
    with pytest.raises(SandboxException) as raised:
        Sandbox.create("no-such-template-xyz", timeout=30)

    assert raised.value.status_code == 404
    assert "no-such-template-xyz" in str(raised.value)


def test_create_with_a_timeout_over_the_maximum_raises_a_400(sdk_env: LiveServer) -> None:
    with pytest.raises(SandboxException) as raised:
        Sandbox.create(timeout=sdk_env.max_timeout * 2)

    assert raised.value.status_code == 400
    assert str(sdk_env.max_timeout) in str(raised.value)


def test_an_invalid_api_key_raises_authentication_exception(sdk_env: LiveServer) -> None:
    bad = "e2b_" + "0" * 40

    with pytest.raises(AuthenticationException):
        Sandbox.create(timeout=30, api_key=bad)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key=bad).next_items()
    with pytest.raises(AuthenticationException):
        Sandbox.get_info("iabc", api_key=bad)


@pytest.mark.sqlite_smoke
def test_a_create_retried_with_the_same_idempotency_key_returns_the_same_sandbox(
    make_sandbox: MakeSandbox, sdk_env: LiveServer, tag: str
) -> None:
    key = str(uuid.uuid4())

    first = make_sandbox(timeout=60, metadata={"tag": tag}, idempotency_key=key)
    retry = make_sandbox(timeout=60, metadata={"tag": tag}, idempotency_key=key)

    assert retry.sandbox_id == first.sandbox_id
    assert list_all(SandboxQuery(metadata={"tag": tag})) == [first.sandbox_id]
    with pytest.raises(SandboxException) as mismatch:
        Sandbox.create(timeout=61, metadata={"tag": tag}, idempotency_key=key)
    assert mismatch.value.status_code == 409
    # Keys are team-scoped: another team's create with the same key is its own sandbox.
    theirs = make_sandbox(timeout=60, idempotency_key=key, api_key=sdk_env.other_api_key)
    assert theirs.sandbox_id != first.sandbox_id
    Sandbox.kill(theirs.sandbox_id, api_key=sdk_env.other_api_key)


# ----------------------------------------------------------------------------- get_info
def test_get_info_reports_every_field_of_a_running_sandbox(
    make_sandbox: MakeSandbox, tag: str
) -> None:
    sandbox = make_sandbox(timeout=90, metadata={"tag": tag})

    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.template_id == "base"
    assert info.name == "base"
    assert info.metadata == {"tag": tag}
    assert info.state == SandboxState.RUNNING
    assert info.started_at.tzinfo is not None
    assert info.started_at <= datetime.now(UTC) + SLACK
    assert seconds(info.end_at - info.started_at) == pytest.approx(90, abs=1)
    assert info.cpu_count > 0
    assert info.memory_mb > 0
    assert Version(info.envd_version) >= Version("0.1.0")
    assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
    # The static form asks the same route.
    assert Sandbox.get_info(sandbox.sandbox_id) == info


def test_get_info_of_an_unknown_sandbox_raises_sandbox_not_found(sdk_env: LiveServer) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info("inosuchsandbox000000")


# ------------------------------------------------------------------------------ connect
def test_connect_to_a_running_sandbox_returns_it_and_never_shortens_its_end_time(
    make_sandbox: MakeSandbox,
) -> None:
    sandbox = make_sandbox(timeout=600)
    end_at = sandbox.get_info().end_at

    same = Sandbox.connect(sandbox.sandbox_id, timeout=60)
    assert same.sandbox_id == sandbox.sandbox_id
    assert same.get_info().end_at == end_at  # 60 s from now is earlier: kept

    requested = datetime.now(UTC) + timedelta(seconds=1200)
    Sandbox.connect(sandbox.sandbox_id, timeout=1200)
    extended = sandbox.get_info()
    assert extended.end_at >= end_at
    assert abs(extended.end_at - requested) <= SLACK
    assert extended.state == SandboxState.RUNNING


@pytest.mark.sqlite_smoke
def test_connect_to_a_paused_sandbox_resumes_it(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(timeout=120)
    assert sandbox.pause() is True
    assert sandbox.get_info().state == SandboxState.PAUSED

    requested = datetime.now(UTC) + timedelta(seconds=240)
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=240)

    assert resumed.sandbox_id == sandbox.sandbox_id
    info = resumed.get_info()
    assert info.state == SandboxState.RUNNING
    assert abs(info.end_at - requested) <= SLACK


def test_connect_on_the_instance_resumes_a_paused_sandbox(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(timeout=120)
    sandbox.pause()

    assert sandbox.connect() is sandbox
    assert sandbox.get_info().state == SandboxState.RUNNING


def test_connect_to_a_killed_sandbox_raises_sandbox_not_found(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox()
    sandbox.kill()

    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id)


# --------------------------------------------------------------------------------- list
def test_list_filters_by_metadata_and_state(make_sandbox: MakeSandbox, tag: str) -> None:
    running = make_sandbox(metadata={"tag": tag, "role": "runner"})
    paused = make_sandbox(metadata={"tag": tag, "role": "sleeper"})
    make_sandbox(metadata={"tag": f"{tag}-other"})
    paused.pause()

    assert sorted(list_all(SandboxQuery(metadata={"tag": tag}))) == sorted(
        [running.sandbox_id, paused.sandbox_id]
    )
    assert list_all(SandboxQuery(metadata={"tag": tag}, state=[SandboxState.RUNNING])) == [
        running.sandbox_id
    ]
    assert list_all(SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED])) == [
        paused.sandbox_id
    ]
    # Several metadata pairs must all match.
    assert list_all(SandboxQuery(metadata={"tag": tag, "role": "sleeper"})) == [paused.sandbox_id]
    assert list_all(SandboxQuery(metadata={"tag": tag, "role": "nobody"})) == []

    listed = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED]))
    (item,) = listed.next_items()
    assert item.state == SandboxState.PAUSED
    assert item.metadata == {"tag": tag, "role": "sleeper"}
    assert item.template_id == "base"


def test_list_pages_through_every_sandbox_exactly_once_newest_first(
    make_sandbox: MakeSandbox, tag: str
) -> None:
    created = [make_sandbox(metadata={"tag": tag}).sandbox_id for _ in range(5)]

    paginator = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2)
    pages = []
    while paginator.has_next:
        pages.append(paginator.next_items())

    assert [len(page) for page in pages] == [2, 2, 1]
    assert paginator.next_token is None
    seen = [info for page in pages for info in page]
    assert sorted(info.sandbox_id for info in seen) == sorted(created)
    starts = [info.started_at for info in seen]
    assert starts == sorted(starts, reverse=True)
    assert [info.sandbox_id for info in seen] == created[::-1]

    ascending = list_all(SandboxQuery(metadata={"tag": tag}), limit=2, order="asc")
    assert ascending == created


def test_list_filters_by_template(make_sandbox: MakeSandbox, tag: str) -> None:
    first = make_sandbox(metadata={"tag": tag})
    second = make_sandbox(metadata={"tag": tag})

    assert sorted(list_all(SandboxQuery(metadata={"tag": tag}, template="base"))) == sorted(
        [first.sandbox_id, second.sandbox_id]
    )
    assert list_all(SandboxQuery(metadata={"tag": tag}, template="no-such-template")) == []


def test_list_started_after_includes_a_sandbox_started_at_that_very_time(
    make_sandbox: MakeSandbox, tag: str
) -> None:
    make_sandbox(metadata={"tag": tag})
    second = make_sandbox(metadata={"tag": tag})
    second_started = second.get_info().started_at

    # "started at or after this time" (E2B's OpenAPI and the SDKs): the second one is.
    assert list_all(SandboxQuery(metadata={"tag": tag}, started_after=second_started)) == [
        second.sandbox_id
    ]


def test_list_matches_metadata_values_with_reserved_characters(
    make_sandbox: MakeSandbox, tag: str
) -> None:
    # The SDKs percent-encode each key and value before form-encoding the filter, so the
    # server must decode them again: a value with spaces, '&' and '=' must still match.
    value = "a b&c=d/é"
    sandbox = make_sandbox(metadata={"tag": tag, "note": value})

    assert sandbox.get_info().metadata["note"] == value
    assert list_all(SandboxQuery(metadata={"tag": tag, "note": value})) == [sandbox.sandbox_id]


# -------------------------------------------------------------------------- set_timeout
def test_set_timeout_can_shorten_and_lengthen_the_end_time(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(timeout=600)

    requested = datetime.now(UTC) + timedelta(seconds=30)
    sandbox.set_timeout(30)
    assert abs(sandbox.get_info().end_at - requested) <= SLACK

    requested = datetime.now(UTC) + timedelta(seconds=900)
    Sandbox.set_timeout(sandbox.sandbox_id, 900)
    assert abs(sandbox.get_info().end_at - requested) <= SLACK


def test_set_timeout_over_the_maximum_raises_a_400(sandbox: Sandbox, sdk_env: LiveServer) -> None:
    with pytest.raises(SandboxException) as raised:
        sandbox.set_timeout(sdk_env.max_timeout + 1)

    assert raised.value.status_code == 400


def test_set_timeout_of_a_paused_sandbox_raises_sandbox_not_found(sandbox: Sandbox) -> None:
    sandbox.pause()

    with pytest.raises(SandboxNotFoundException):
        sandbox.set_timeout(60)


# ---------------------------------------------------------------------------- pause/kill
def test_pause_answers_true_then_false_when_already_paused(sandbox: Sandbox) -> None:
    assert sandbox.pause() is True
    assert Sandbox.pause(sandbox.sandbox_id) is False
    assert sandbox.get_info().state == SandboxState.PAUSED


def test_pause_of_an_unknown_sandbox_raises_sandbox_not_found(sdk_env: LiveServer) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause("inosuchsandbox000000")


@pytest.mark.sqlite_smoke
def test_kill_answers_true_then_false_and_the_sandbox_is_gone(sandbox: Sandbox, tag: str) -> None:
    assert sandbox.kill() is True
    assert Sandbox.kill(sandbox.sandbox_id) is False

    with pytest.raises(NotFoundException):
        sandbox.get_info()
    assert sandbox.sandbox_id not in list_all(SandboxQuery())


def test_kill_of_a_paused_sandbox_answers_true(sandbox: Sandbox) -> None:
    sandbox.pause()

    assert sandbox.kill() is True
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id)


# ------------------------------------------------------------------------------ metrics
def test_get_metrics_returns_a_sample_with_cpu_and_memory(sandbox: Sandbox) -> None:
    metrics = sandbox.get_metrics()

    assert metrics, "expected at least one metrics sample"
    sample = metrics[-1]
    assert sample.cpu_count > 0
    assert sample.mem_total > 0
    assert sample.mem_used >= 0
    assert sample.disk_total > 0
    assert 0 <= sample.cpu_used_pct <= 100
    assert abs(sample.timestamp - datetime.now(UTC)) <= SLACK
    assert Sandbox.get_metrics(sandbox.sandbox_id)


def test_get_metrics_of_an_unknown_sandbox_raises_sandbox_not_found(sdk_env: LiveServer) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics("inosuchsandbox000000")


# --------------------------------------------------------------------------- cross-team
def test_another_team_cannot_see_or_touch_our_sandbox(
    sandbox: Sandbox, sdk_env: LiveServer
) -> None:
    other_key = sdk_env.other_api_key
    sandbox_id = sandbox.sandbox_id
    before = sandbox.get_info()

    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox_id, api_key=other_key)
    assert Sandbox.kill(sandbox_id, api_key=other_key) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(sandbox_id, api_key=other_key)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox_id, api_key=other_key)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(sandbox_id, 5, api_key=other_key)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics(sandbox_id, api_key=other_key)
    assert sandbox_id not in list_all(SandboxQuery(), api_key=other_key)

    after = sandbox.get_info()
    assert after.state == SandboxState.RUNNING
    assert after.end_at == before.end_at


# ---------------------------------------------------------------------------- lifecycle
@pytest.mark.sqlite_smoke
def test_a_sandbox_is_killed_when_its_timeout_passes(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(timeout=1)

    def gone() -> bool:
        try:
            Sandbox.get_info(sandbox.sandbox_id)
        except SandboxNotFoundException:
            return True
        return False

    # The lifecycle worker acts within a tick of endAt.
    eventually(gone, within=10, every=0.1, what="the sandbox killed at its timeout")
    assert Sandbox.kill(sandbox.sandbox_id) is False


def test_a_shortened_timeout_kills_the_sandbox_at_the_new_end_time(
    make_sandbox: MakeSandbox,
) -> None:
    sandbox = make_sandbox(timeout=600)
    sandbox.set_timeout(1)

    eventually(
        lambda: Sandbox.kill(sandbox.sandbox_id) is False,
        within=10,
        every=0.1,
        what="the sandbox killed at its new end time",
    )


def test_a_sandbox_created_to_pause_on_timeout_is_paused_then_resumed_by_connect(
    make_sandbox: MakeSandbox,
) -> None:
    sandbox = make_sandbox(timeout=1, lifecycle={"on_timeout": "pause"})
    assert sandbox.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}

    eventually(
        lambda: sandbox.get_info().state,
        until=lambda state: state == SandboxState.PAUSED,
        within=10,
        every=0.1,
        what="the sandbox paused at its timeout",
    )

    Sandbox.connect(sandbox.sandbox_id, timeout=60)
    info = sandbox.get_info()
    assert info.state == SandboxState.RUNNING
    assert info.end_at > datetime.now(UTC) + timedelta(seconds=30)


# ----------------------------------------------------------------- filesystem-only pause
def test_auto_resume_cannot_be_combined_with_a_filesystem_timeout_pause(
    sdk_env: LiveServer,
) -> None:
    # The SDK refuses it itself; the server must too (another client may send it).
    response = httpx.post(
        f"{sdk_env.url}/v2/sandboxes",
        headers={"X-API-Key": sdk_env.api_key},
        json={
            "templateID": "base",
            "autoPause": True,
            "autoPauseMemory": False,
            "autoResume": {"enabled": True},
        },
    )
    assert response.status_code == 400, response.text
    assert "autoResume" in response.json()["message"]
