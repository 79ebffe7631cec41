"""Templates with a start command, and the warm pool of started sandboxes a create takes
(e2bfacade/runtime/local/pools/warm.py): a create returns once the command is ready, a broken
command leaves nothing, a pool sandbox goes to exactly one create and becomes that
create's sandbox (id, host name, env vars, groups, slot), a crash mid-claim re-drives to one
sandbox, and pool sandboxes are in no listing."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import CreateRefused, ImageBuild, SandboxSpec, StartCommand
from e2bfacade.runtime.local import LocalRuntime
from e2bfacade.runtime.local.pools import warm
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.runtime.helpers import ok
from tests.support.waiting import eventually, stays

PORT = 8000
# A service that opens its port a little after it starts, as a real one does.
SERVICE = (
    "/usr/bin/python3",
    "-c",
    "import os, socket, time; time.sleep(0.2); s = socket.socket(); "
    f"s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', {PORT})); "
    "s.listen(); print('pid', os.getpid(), flush=True)\n"
    "while True: s.accept()[0].close()",
)


def _nothing(rootfs: Path) -> None:
    (rootfs / "etc").mkdir()
    (rootfs / "etc/greeting").write_text("from the image\n")


def image(rt: LocalRuntime, name: str, start: StartCommand | None) -> str:
    rt.build_image(
        ImageBuild(
            image_id=name,
            parent="base",
            populate=_nothing,
            env={"GREETING": "hello", "SHADOWED": "image"},
            start=start,
        )
    )
    return name


@pytest.fixture(scope="module")
def rt() -> Iterator[LocalRuntime]:
    runtime = make_runtime("e2bw-", spares=0, warm=1)
    runtime.ensure_base_image()
    image(runtime, "svc", StartCommand(argv=SERVICE, ready_port=PORT, ready_timeout=20))
    yield runtime
    destroy_runtime(runtime)


def new_id() -> str:
    return f"w{uuid.uuid4().hex[:12]}"


def spec(sid: str, **kw: object) -> SandboxSpec:
    return SandboxSpec(sid, "svc", memory_mb=256, **kw)  # type: ignore[arg-type]


def pool(rt: LocalRuntime) -> list[Path]:
    return warm.ready(rt.root / "sandboxes", warm.shape_key(spec("x"), rt.version))


def filled(rt: LocalRuntime) -> Path:
    rt.keep_warm(spec("shape"))
    eventually(lambda: pool(rt), within=30, what="a pool sandbox ready")
    return pool(rt)[0]


def port_open(rt: LocalRuntime, sid: str) -> bool:
    try:
        rt.guest(sid).connect_port(PORT, timeout=1).close()
    except OSError:
        return False
    return True


def leftovers(rt: LocalRuntime, name: str) -> list[str]:
    """What is left of the sandbox ``name`` on the host: directory, groups, slot."""
    left = []
    if (rt.root / "sandboxes" / name).exists():
        left.append("directory")
    if rt.cgroups.exists(name):
        left.append("groups")
    if rt.layout.slot_of(name) is not None or (rt.root / "ids" / f"s-{name}").is_symlink():
        left.append("slot")
    return left


# --------------------------------------------------------------------- start commands
def test_a_create_returns_once_the_start_command_listens(rt: LocalRuntime) -> None:
    rt.warm.target, target = 0, rt.warm.target  # a cold create, with its own start
    try:
        sid = new_id()
        started = time.monotonic()
        rt.create(spec(sid))
        assert time.monotonic() - started >= 0.2  # the service's own start-up delay
        assert port_open(rt, sid)
        listed = [p for p in rt.guest(sid).list_processes() if p.tag == "start"]
        assert len(listed) == 1 and listed[0].argv == SERVICE
        # It runs as the template's user, and every process gets the image's env under
        # the sandbox's own.
        assert ok(rt, sid, "pgrep -u user -f socket.socket >/dev/null && echo as-user") == (
            "as-user\n"
        )
        rt.kill(sid)
        sid = new_id()
        rt.create(spec(sid, env_vars={"SHADOWED": "sandbox"}))
        assert ok(rt, sid, "echo $GREETING $SHADOWED; cat /etc/greeting") == (
            "hello sandbox\nfrom the image\n"
        )
        rt.kill(sid)
    finally:
        rt.warm.target = target


@pytest.mark.parametrize(
    ("argv", "timeout", "said"),
    [
        (("/bin/sh", "-c", "echo it broke >&2; exit 3"), 20.0, "exited (status 3)"),
        (("/bin/sleep", "60"), 0.5, "did not open port"),
    ],
    ids=["exits", "never-listens"],
)
def test_a_start_command_that_fails_leaves_nothing(
    rt: LocalRuntime, argv: tuple[str, ...], timeout: float, said: str
) -> None:
    name = f"broken-{uuid.uuid4().hex[:6]}"
    image(rt, name, StartCommand(argv=argv, ready_port=8001, ready_timeout=timeout))
    sid = new_id()
    with pytest.raises(CreateRefused) as caught:
        rt.create(SandboxSpec(sid, name, memory_mb=256))
    assert said in caught.value.message
    if "exited" in said:
        assert "it broke" in caught.value.message  # its own words, for the operator
    assert leftovers(rt, sid) == []
    assert sid not in {s.sandbox_id for s in rt.list()}


# ------------------------------------------------------------------------- warm pool
def test_a_create_takes_a_pool_sandbox_and_it_becomes_the_creates(rt: LocalRuntime) -> None:
    ready = filled(rt)
    pool_id = ready.name
    pool_init = json.loads((ready / "state.json").read_text())["init_pid"]
    assert pool_id not in {s.sandbox_id for s in rt.list()}  # no one's sandbox
    sid = new_id()
    started = time.monotonic()
    info = rt.create(spec(sid, env_vars={"E2B_SANDBOX_ID": sid, "SHADOWED": "claim"}))
    took = time.monotonic() - started
    assert info.init_pid == pool_init, "the create did not take the pool sandbox"
    assert took < 0.2, f"a claim took {took:.3f} s"  # the service's start-up is 0.2 s alone
    assert info.sandbox_id == sid and sid in {s.sandbox_id for s in rt.list()}
    assert leftovers(rt, pool_id) == []
    assert rt.cgroups.exists(sid) and rt.layout.slot_of(sid) is not None
    # Its start command still serves, and the guest sees the create's identity.
    assert port_open(rt, sid)
    assert ok(rt, sid, "hostname; echo $E2B_SANDBOX_ID $SHADOWED") == f"{sid}\n{sid} claim\n"
    env = json.loads(ok(rt, sid, f"cat {'/run/e2b/env.json'}"))
    assert env == {"E2B_SANDBOX_ID": sid, "SHADOWED": "claim"}
    # The pool is refilled behind it.
    eventually(lambda: pool(rt), within=30, what="the pool refilled")
    rt.kill(sid)
    assert leftovers(rt, sid) == []


def test_a_pool_sandbox_goes_to_exactly_one_of_concurrent_creates(rt: LocalRuntime) -> None:
    ready = filled(rt)
    pool_init = json.loads((ready / "state.json").read_text())["init_pid"]
    # One pool sandbox for two creates (a refill takes longer than both: the service alone
    # waits 0.2 s before it listens).
    ids = [new_id(), new_id()]
    infos = {}
    barrier = threading.Barrier(2)

    def create(sid: str) -> None:
        barrier.wait()
        infos[sid] = rt.create(spec(sid))

    threads = [threading.Thread(target=create, args=(sid,)) for sid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(infos) == sorted(ids)
    assert [i.init_pid for i in infos.values()].count(pool_init) == 1
    assert all(port_open(rt, sid) for sid in ids)
    for sid in ids:
        rt.kill(sid)


@pytest.mark.parametrize("stage", ["renamed", "groups-renamed", "slot-moved"])
def test_a_crash_mid_claim_redrives_to_one_sandbox(rt: LocalRuntime, stage: str) -> None:
    """A claim interrupted after each of its steps (as a killed process leaves it): the
    create's retry makes one sandbox of that id, and nothing of the pool sandbox is left."""
    ready = filled(rt)
    pool_id = ready.name
    sid = new_id()
    d = rt.root / "sandboxes" / sid
    os.rename(ready, d)
    if stage in ("groups-renamed", "slot-moved"):
        assert rt.cgroups.adopt(pool_id, sid)
    if stage == "slot-moved":
        assert rt.layout.slot_move(pool_id, sid) is not None
    assert rt.layout.read_state(sid) is None  # not a sandbox to anyone yet
    assert sid not in {s.sandbox_id for s in rt.list()}
    info = rt.create(spec(sid))
    assert info.sandbox_id == sid and port_open(rt, sid)
    assert leftovers(rt, pool_id) == []
    assert [s.sandbox_id for s in rt.list()].count(sid) == 1
    rt.kill(sid)
    assert leftovers(rt, sid) == []


def test_the_sweep_ends_an_abandoned_claim_and_stale_pool_sandboxes(rt: LocalRuntime) -> None:
    ready = filled(rt)
    pool_id, sid = ready.name, new_id()
    os.rename(ready, rt.root / "sandboxes" / sid)  # a claim whose create never came back
    rt.warm.target, target = 0, rt.warm.target
    try:
        rt.sweep()
        assert leftovers(rt, sid) == [] and leftovers(rt, pool_id) == []
    finally:
        rt.warm.target = target
    # A pool sandbox made by other helper binaries serves no create: the sweep ends it.
    ready = filled(rt)
    state = json.loads((ready / "state.json").read_text())
    (ready / "state.json").write_text(json.dumps({**state, "warm_version": "older"}))
    rt.warm.target = 0
    try:
        rt.sweep()
        assert leftovers(rt, ready.name) == []
    finally:
        rt.warm.target = target


def test_discarding_the_pool_ends_its_sandboxes(rt: LocalRuntime) -> None:
    ready = filled(rt)
    rt.warm.discard()
    assert leftovers(rt, ready.name) == []
    assert not [p for p in os.listdir(rt.root / "sandboxes") if warm.is_warm(p)]
    rt.warm.target = 1


# ------------------------------------------------------- a pool for any template (warm_pool)
def base_spec(sid: str, **kw: object) -> SandboxSpec:
    return SandboxSpec(sid, "base", memory_mb=320, **kw)  # type: ignore[arg-type]


def base_pool(rt: LocalRuntime) -> list[Path]:
    return warm.ready(rt.root / "sandboxes", warm.shape_key(base_spec("x"), rt.version))


def test_a_template_without_a_start_command_gets_the_pool_it_asks_for(rt: LocalRuntime) -> None:
    # By default a template without a start command has no pool...
    sid = new_id()
    rt.create(base_spec(sid))
    stays(lambda: base_pool(rt), for_=0.3, what="a pool for a template without one")
    rt.kill(sid)
    # ... and with ``warm_pool`` it has that many.
    rt.keep_warm(base_spec("shape", warm_pool=2))
    eventually(lambda: base_pool(rt), until=lambda p: len(p) == 2, within=30, what="2 ready")
    ready = base_pool(rt)[0]
    pool_init = json.loads((ready / "state.json").read_text())["init_pid"]
    assert not {p.name for p in base_pool(rt)} & {s.sandbox_id for s in rt.list()}

    sid = new_id()
    info = rt.create(
        base_spec(sid, warm_pool=2, env_vars={"E2B_SANDBOX_ID": sid}, envd_access_token="tok")
    )
    assert info.init_pid == pool_init, "the create did not take the pool sandbox"
    assert (info.sandbox_id, info.envd_access_token) == (sid, "tok")
    assert leftovers(rt, ready.name) == []
    assert ok(rt, sid, "hostname; echo $E2B_SANDBOX_ID") == f"{sid}\n{sid}\n"
    assert not (rt.root / "sandboxes" / sid / warm.READY).exists()
    assert rt.create(base_spec(sid, warm_pool=2)).init_pid == pool_init  # adopted, as ever
    eventually(lambda: base_pool(rt), until=lambda p: len(p) == 2, within=30, what="a refill")
    rt.kill(sid)
    assert leftovers(rt, sid) == []
    for p in base_pool(rt):
        rt.kill(p.name)


def test_warm_pool_zero_turns_a_start_commands_pool_off(rt: LocalRuntime) -> None:
    with rt.warm.filling:  # no refill under way: end every pool sandbox, starting ones too
        for name in rt.layout.sandbox_ids():
            if warm.is_warm(name):
                rt.kill(name)
    sid = new_id()
    rt.create(spec(sid, warm_pool=0))
    stays(  # the service alone takes 0.2 s: a refill would have begun
        lambda: warm.count(rt.root / "sandboxes", warm.shape_key(spec("x"), rt.version)),
        for_=0.5,
        what="a refill of a pool turned off",
    )
    rt.kill(sid)


def test_warm_pools_keeps_the_pools_it_is_told_and_ends_every_other(rt: LocalRuntime) -> None:
    two, one = base_spec("shape", warm_pool=2), base_spec("shape", warm_pool=1)
    rt.warm_pools([two])
    eventually(lambda: base_pool(rt), until=lambda p: len(p) == 2, within=30, what="2 ready")
    with rt.warm.filling:
        pass  # the refill has ended (it would otherwise count what we end next)
    rt.warm_pools([one])  # made smaller: the extra one ends
    assert len(base_pool(rt)) == 1
    rt.warm_pools([])  # turned off: none is left, and none is made again
    assert base_pool(rt) == []
    with rt.warm.filling:
        pass  # a refill under way has ended
    assert warm.count(rt.root / "sandboxes", warm.shape_key(two, rt.version)) == 0
