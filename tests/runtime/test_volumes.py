"""Volumes in the local runtime: storage that outlives sandboxes, mounted live and shared
into every sandbox that names it, with a real size limit, guest owners in every sandbox's
id range, no way out of it to the host, and nothing of it in a snapshot. Real sandboxes;
the host is looked at directly (its mounts, loop devices, the volume's files)."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2bfacade.runtime.base import (
    Capability,
    CreateRefused,
    PauseMode,
    RuntimeConflict,
    SandboxNotFound,
    SandboxSpec,
    SandboxState,
)
from e2bfacade.runtime.local import LocalRuntime
from e2bfacade.runtime.local.launcher.sandboxer import MAX_FDS
from e2bfacade.runtime.local.record import SandboxRecord
from e2bfacade.runtime.local.storage import volumes as store
from e2bfacade.runtime.local.teardown import loops_under, mounts_under, teardown_root
from e2bfacade.runtime.volumes import (
    MAX_MOUNTS_PER_SANDBOX,
    VolumeInUse,
    VolumeMount,
    VolumeNotFound,
)
from tests.runtime.conftest import destroy_runtime, make_runtime
from tests.runtime.helpers import MiB, ok, sh
from tests.support.runtime_support import power_cut
from tests.support.waiting import eventually

GUEST_USER = 1000


@pytest.fixture
def new_volume(runtime: LocalRuntime) -> Iterator[Callable[..., str]]:
    """A factory of volumes (size in MB); each is deleted when the test ends, after the
    sandboxes that mount it are killed."""
    made: list[str] = []

    def make(size_mb: int = 16) -> str:
        volume_id = f"v{uuid.uuid4().hex[:12]}"
        made.append(volume_id)
        info = runtime.create_volume(volume_id, size_mb)
        assert (info.volume_id, info.size_mb) == (volume_id, size_mb)
        return volume_id

    yield make
    for volume_id in made:
        for sid in runtime.volume_users(volume_id):
            runtime.kill(sid)
        runtime.delete_volume(volume_id)


def host_dir(rt: LocalRuntime, volume_id: str) -> Path:
    """The volume's files on the host, mounted (not through the runtime's own answer)."""
    path = rt.root / "volumes" / volume_id / "data"
    assert os.path.ismount(path)
    return path


def with_volumes(sid: str, *mounts: tuple[str, str], image: str = "base") -> SandboxSpec:
    return SandboxSpec(sid, image, volume_mounts=tuple(VolumeMount(v, p) for v, p in mounts))


def guest_mount_line(rt: LocalRuntime, sid: str, path: str) -> str:
    lines = ok(rt, sid, "cat /proc/self/mountinfo").splitlines()
    found = [line for line in lines if line.split()[4] == path]
    assert len(found) == 1, lines
    return found[0]


def test_the_driver_declares_volume_mounts() -> None:
    assert Capability.VOLUME_MOUNTS in LocalRuntime.capabilities_for({})
    assert Capability.VOLUME_MOUNTS in LocalRuntime.capabilities_for({"network": object()})


def test_a_volume_is_its_own_file_system_of_its_size_owned_by_the_guest_user(
    runtime: LocalRuntime, new_volume: Callable[..., str]
) -> None:
    volume_id = new_volume(24)
    d = runtime.root / "volumes" / volume_id
    image = d / store.IMAGE
    assert image.stat().st_size == 24 * MiB
    assert image.stat().st_blocks * 512 < 8 * MiB  # sparse
    assert (os.stat(d).st_mode & 0o777, os.stat(d.parent).st_mode & 0o777) == (0o700, 0o700)
    data = host_dir(runtime, volume_id)
    st = os.stat(data)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (GUEST_USER, GUEST_USER, 0o755)
    assert os.listdir(data) == []  # no lost+found
    assert os.statvfs(data).f_blocks * os.statvfs(data).f_frsize <= 24 * MiB
    # Idempotent by id: the volume as it is, with its own size.
    (data / "kept").write_bytes(b"x")
    again = runtime.create_volume(volume_id, 64)
    assert again.size_mb == 24 and (data / "kept").read_bytes() == b"x"
    assert runtime.volume_info(volume_id).used_bytes > 0
    with pytest.raises(VolumeNotFound):
        runtime.volume_info("nosuchvolume")
    with pytest.raises(CreateRefused):
        runtime.create_volume(f"v{uuid.uuid4().hex[:12]}", 1)  # below the minimum
    with pytest.raises(CreateRefused):
        runtime.create_volume(f"v{uuid.uuid4().hex[:12]}", 1 << 40)  # past the host's disk
    assert runtime.delete_volume("nosuchvolume") is False


def test_two_sandboxes_share_a_volume_live_and_user_owns_what_it_writes_in_both(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str], new_volume: Callable[..., str]
) -> None:
    volume_id = new_volume()
    a, b = new_sandbox_id(), new_sandbox_id()
    runtime.create(with_volumes(a, (volume_id, "/mnt/data")))
    runtime.create(with_volumes(b, (volume_id, "/home/user/shared")))
    bases = {runtime.layout.id_base_of(a), runtime.layout.id_base_of(b)}
    assert len(bases) == 2  # two id ranges

    ok(runtime, a, "echo from-a > /mnt/data/a.txt", user="user")
    assert ok(runtime, b, "cat /home/user/shared/a.txt; stat -c %U:%G /home/user/shared/a.txt") == (
        "from-a\nuser:user\n"
    )
    ok(
        runtime,
        b,
        "mkdir /home/user/shared/dir && echo from-b > /home/user/shared/dir/b",
        user="user",
    )
    assert ok(runtime, a, "cat /mnt/data/dir/b; stat -c %U /mnt/data/dir /mnt/data/dir/b") == (
        "from-b\nuser\nuser\n"
    )
    ok(runtime, a, "echo by-root > /mnt/data/root.txt")
    assert ok(runtime, b, "stat -c %U /home/user/shared/root.txt") == "root\n"
    # On the host: stored with guest ids, whatever the sandbox's range.
    data = host_dir(runtime, volume_id)
    owners = {n: os.stat(data / n).st_uid for n in ("a.txt", "dir", "dir/b", "root.txt")}
    assert owners == {"a.txt": GUEST_USER, "dir": GUEST_USER, "dir/b": GUEST_USER, "root.txt": 0}
    # Writable, no devices, no set-id programs, in each sandbox.
    for sid, path in ((a, "/mnt/data"), (b, "/home/user/shared")):
        line = guest_mount_line(runtime, sid, path)
        options = line.split()[5].split(",")
        assert "rw" in options and "nodev" in options and "nosuid" in options, line


def test_content_survives_pause_resume_a_filesystem_pause_its_cold_boot_and_kill(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str], new_volume: Callable[..., str]
) -> None:
    volume_id = new_volume()
    sid = new_sandbox_id()
    runtime.create(with_volumes(sid, (volume_id, "/data")))
    ok(runtime, sid, "echo one > /data/f", user="user")

    runtime.pause(sid)
    runtime.resume(sid)
    ok(runtime, sid, "echo two >> /data/f", user="user")

    runtime.pause(sid, memory=False)
    assert runtime.status(sid).pause_mode is PauseMode.FILESYSTEM
    runtime.resume(sid)  # a cold boot: the mount is made again from the record
    guest_mount_line(runtime, sid, "/data")
    ok(runtime, sid, "echo three >> /data/f", user="user")

    assert runtime.kill(sid) is True
    assert (host_dir(runtime, volume_id) / "f").read_text() == "one\ntwo\nthree\n"
    other = new_sandbox_id()
    runtime.create(with_volumes(other, (volume_id, "/elsewhere")))
    assert ok(runtime, other, "cat /elsewhere/f") == "one\ntwo\nthree\n"


def test_a_guest_filling_a_volume_meets_enospc_and_the_host_disk_stays_within_its_size(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str], new_volume: Callable[..., str]
) -> None:
    volume_id = new_volume(8)
    sid = new_sandbox_id()
    runtime.create(with_volumes(sid, (volume_id, "/mnt/v")))
    full = sh(runtime, sid, "dd if=/dev/zero of=/mnt/v/fill bs=1M count=32", user="user")
    assert full.exit_code != 0 and b"No space left" in full.stderr, full
    image = runtime.root / "volumes" / volume_id / store.IMAGE
    assert image.stat().st_blocks * 512 <= 8 * MiB
    assert image.stat().st_size == 8 * MiB
    # The sandbox's own disk is untouched by it, and the volume frees again.
    ok(runtime, sid, "rm /mnt/v/fill && echo ok > /mnt/v/small")


def test_mount_paths_are_checked_before_anything_is_made(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str], new_volume: Callable[..., str]
) -> None:
    volume_id = new_volume()
    bad = [
        "relative",
        "/",
        "/mnt/../etc",
        "/mnt/data/",
        "//mnt",
        "/mnt/./x",
        "/a\0b",
    ]
    for path in bad:
        sid = new_sandbox_id()
        with pytest.raises(CreateRefused):
            runtime.create(with_volumes(sid, (volume_id, path)))
        with pytest.raises(SandboxNotFound):
            runtime.status(sid)
    for mounts in (
        [(volume_id, "/x"), (volume_id, "/x")],
        [(volume_id, "/x"), (volume_id, "/x/y")],
        [(volume_id, f"/m{i}") for i in range(MAX_MOUNTS_PER_SANDBOX + 1)],
        [("nosuchvolume", "/x")],
    ):
        sid = new_sandbox_id()
        with pytest.raises(CreateRefused):
            runtime.create(with_volumes(sid, *mounts))
        with pytest.raises(SandboxNotFound):
            runtime.status(sid)
        assert not runtime.layout.sandbox_dir(sid).exists()


def test_volumes_count_against_the_mounts_one_sandbox_may_be_handed(
    runtime: LocalRuntime, new_volume: Callable[..., str]
) -> None:
    """The launcher hands the init at most MAX_FDS mounts in one message: layers, binds,
    lxcfs and volumes together. One more is refused before anything is started."""
    volume_id = new_volume()
    record = SandboxRecord(
        sandbox_id="tfdcount",
        image_id="base",
        id_base=0,
        cpu_count=1,
        memory_mb=64,
        pids_max=64,
        disk_mb=64,
        created_at=0.0,
        volume_mounts=tuple(VolumeMount(volume_id, f"/m{i}") for i in range(4)),
    )
    layer = dataclasses.replace(runtime.images.chain("base")[0], host_binds=())
    deep = [layer] * (MAX_FDS - 1 - 4 + 1)  # with lxcfs and 4 volumes: one too many
    with pytest.raises(CreateRefused, match=f"need {MAX_FDS + 1} mounts"):
        runtime.lifecycle.launch(record, deep)
    assert not runtime.layout.sandbox_dir("tfdcount").exists()
    assert not runtime.cgroups.exists("tfdcount")


def test_a_guest_cannot_reach_outside_the_volume_through_it(
    runtime: LocalRuntime,
    new_sandbox_id: Callable[[], str],
    new_volume: Callable[..., str],
    host_scratch: Path,
) -> None:
    volume_id = new_volume()
    # An image whose mount points are symlinks to a host directory's path, absolute and
    # by "..": followed on the host, the volume would be mounted over the host's files.
    maker = new_sandbox_id()
    runtime.create(SandboxSpec(maker, "base"))
    ok(
        runtime,
        maker,
        f"mkdir -p {host_scratch} /mnt && ln -s {host_scratch} /mnt/abs && "
        f"ln -s ../../../../../../..{host_scratch} /mnt/rel",
    )
    image = f"i{uuid.uuid4().hex[:12]}"
    runtime.snapshot(maker, image)
    try:
        for link in ("/mnt/abs", "/mnt/rel"):
            sid = new_sandbox_id()
            runtime.create(with_volumes(sid, (volume_id, link), image=image))
            ok(runtime, sid, f"echo in > {link}/through-{link[5:]}")
            # Resolved inside the guest's root: the guest's directory of that name holds it.
            assert ok(runtime, sid, f"cat {host_scratch}/through-{link[5:]}") == "in\n"
            assert (host_dir(runtime, volume_id) / f"through-{link[5:]}").read_text() == "in\n"
            assert os.listdir(host_scratch) == [] and not os.path.ismount(host_scratch)
            runtime.kill(sid)
    finally:
        runtime.kill(maker)
        for sid in runtime.layout.sandbox_ids():
            record = runtime.layout.read_state(sid)
            if record is not None and record.image_id == image:
                runtime.kill(sid)
        runtime.delete_image(image)

    sid = new_sandbox_id()
    runtime.create(with_volumes(sid, (volume_id, "/mnt/v")))
    (host_scratch / "secret").write_text("host secret\n")
    # ".." from the volume's root is the guest's /mnt, never the host's.
    assert ok(runtime, sid, "cd /mnt/v/../../../..; pwd; ls /mnt/v/..") == "/\nv\n"
    # A hard link to a file of another file system (the guest's own root: the host's
    # files are not in its view at all) is refused, not copied in.
    hard = sh(runtime, sid, "ln /etc/passwd /mnt/v/passwd")
    assert hard.exit_code != 0 and b"Invalid cross-device link" in hard.stderr, hard
    assert not (host_dir(runtime, volume_id) / "passwd").exists()
    # Symlinks in the volume are the guest's to follow, inside its own root.
    ok(runtime, sid, f"ln -s {host_scratch}/secret /mnt/v/to-host; ln -s ../../../.. /mnt/v/up")
    assert sh(runtime, sid, "cat /mnt/v/to-host").exit_code != 0
    assert ok(runtime, sid, "ls /mnt/v/up/mnt") == "v\n"


def test_delete_is_refused_while_a_live_sandbox_mounts_it_and_works_after_kill(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    volume_id = f"v{uuid.uuid4().hex[:12]}"
    runtime.create_volume(volume_id, 16)
    running, parked = new_sandbox_id(), new_sandbox_id()
    runtime.create(with_volumes(running, (volume_id, "/v")))
    runtime.create(with_volumes(parked, (volume_id, "/v")))
    runtime.pause(parked, memory=False)
    ok(runtime, running, "echo x > /v/x")
    with pytest.raises(VolumeInUse):
        runtime.delete_volume(volume_id)
    runtime.kill(running)
    with pytest.raises(VolumeInUse):  # paused, filesystem only: still live
        runtime.delete_volume(volume_id)
    assert host_dir(runtime, volume_id).joinpath("x").read_text() == "x\n"
    runtime.kill(parked)

    assert runtime.delete_volume(volume_id) is True
    assert not (runtime.root / "volumes" / volume_id).exists()
    assert not [m for m in mounts_under(runtime.root) if volume_id in m]
    assert runtime.delete_volume(volume_id) is False
    with pytest.raises(VolumeNotFound):
        runtime.volume_info(volume_id)
    sid = new_sandbox_id()
    with pytest.raises(CreateRefused):
        runtime.create(with_volumes(sid, (volume_id, "/v")))


def test_a_delete_racing_creates_either_refuses_or_leaves_no_sandbox_with_the_volume(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str]
) -> None:
    for _ in range(3):
        volume_id = f"v{uuid.uuid4().hex[:12]}"
        runtime.create_volume(volume_id, 8)
        sids = [new_sandbox_id() for _ in range(2)]
        outcome: dict[str, object] = {}
        start = threading.Barrier(len(sids) + 1)

        def create(
            sid: str, vid: str, start: threading.Barrier, outcome: dict[str, object]
        ) -> None:
            start.wait(timeout=10)
            try:
                outcome[sid] = runtime.create(with_volumes(sid, (vid, "/v")))
            except CreateRefused as exc:
                outcome[sid] = exc

        threads = [
            threading.Thread(target=create, args=(sid, volume_id, start, outcome)) for sid in sids
        ]
        for t in threads:
            t.start()
        start.wait(timeout=10)
        try:
            deleted: bool | VolumeInUse = runtime.delete_volume(volume_id)
        except VolumeInUse as exc:
            deleted = exc
        for t in threads:
            t.join(timeout=60)
        made = [sid for sid in sids if not isinstance(outcome[sid], CreateRefused)]
        if deleted is True:
            # Every create that got the volume started before the delete's check and
            # would have made it refuse: so none did.
            assert made == [], outcome
            assert not (runtime.root / "volumes" / volume_id).exists()
        else:
            assert isinstance(deleted, VolumeInUse) and made, (deleted, outcome)
            for sid in made:
                ok(runtime, sid, "echo alive > /v/f")
                runtime.kill(sid)
            assert runtime.delete_volume(volume_id) is True


def test_a_snapshot_of_a_sandbox_with_a_volume_holds_none_of_its_files(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str], new_volume: Callable[..., str]
) -> None:
    volume_id = new_volume()
    sid = new_sandbox_id()
    runtime.create(with_volumes(sid, (volume_id, "/mnt/data")))
    ok(runtime, sid, "echo volume > /mnt/data/in-volume; echo disk > /home/user/on-disk")
    image = f"i{uuid.uuid4().hex[:12]}"
    runtime.snapshot(sid, image)
    try:
        layer = runtime.layout.image_dir(image) / "rootfs"
        assert (layer / "home/user/on-disk").exists()
        assert os.listdir(layer / "mnt/data") == []  # the mount point, empty
        child = new_sandbox_id()
        runtime.create(SandboxSpec(child, image))
        assert ok(runtime, child, "cat /home/user/on-disk; ls -A /mnt/data") == "disk\n"
        runtime.kill(child)
    finally:
        runtime.kill(sid)
        runtime.delete_image(image)


def test_a_create_of_an_existing_sandbox_compares_its_mounts(
    runtime: LocalRuntime, new_sandbox_id: Callable[[], str], new_volume: Callable[..., str]
) -> None:
    v1, v2 = new_volume(), new_volume()
    sid = new_sandbox_id()
    spec = with_volumes(sid, (v1, "/a"))
    first = runtime.create(spec)
    assert runtime.create(spec).adopted and runtime.create(spec).init_pid == first.init_pid
    for other in (with_volumes(sid, (v2, "/a")), with_volumes(sid, (v1, "/b")), with_volumes(sid)):
        with pytest.raises(RuntimeConflict):
            runtime.create(other)
    assert runtime.status(sid).volume_mounts == spec.volume_mounts
    # A new runtime object on the root (a restarted service) reads them from the record.
    assert LocalRuntime(runtime.root, spares=0).status(sid).volume_mounts == spec.volume_mounts


def test_a_power_cut_and_a_new_runtime_keep_volumes_and_teardown_leaves_nothing() -> None:
    rt = make_runtime(prefix="e2bv-", spares=0)
    root = rt.root
    try:
        rt.ensure_base_image()
        volume_id = "vpower"
        rt.create_volume(volume_id, 16)
        rt.create(with_volumes("vprun", (volume_id, "/v")))
        rt.create(with_volumes("vpfs", (volume_id, "/w")))
        # A service that stops lets go of the host mount; the running sandbox keeps its
        # own, and the next use on the host mounts the very same file system again.
        rt.discard_spares()
        assert not os.path.ismount(root / "volumes" / volume_id / "data")
        ok(rt, "vprun", "echo before > /v/f", user="user")
        assert (rt.volume_files(volume_id).root / "f").read_text() == "before\n"
        ok(rt, "vprun", "sync")
        rt.pause("vpfs", memory=False)

        power_cut(root)
        assert not os.path.ismount(root / "volumes" / volume_id / "data")
        restarted = LocalRuntime(root, spares=0)  # the service started again on the root
        with pytest.raises(VolumeInUse):
            restarted.delete_volume(volume_id)
        for sid, path in (("vprun", "/v"), ("vpfs", "/w")):
            info = restarted.status(sid)
            assert (info.state, info.pause_mode) == (SandboxState.PAUSED, PauseMode.FILESYSTEM)
            restarted.resume(sid)
            assert ok(restarted, sid, f"cat {path}/f") == "before\n"
        ok(restarted, "vpfs", "echo after >> /w/f", user="user")
        assert ok(restarted, "vprun", "cat /v/f") == "before\nafter\n"
        restarted.create(with_volumes("vpnew", (volume_id, "/n")))
        assert ok(restarted, "vpnew", "cat /n/f") == "before\nafter\n"
        os.kill(restarted.status("vpnew").init_pid, signal.SIGKILL)  # its own crash
        eventually(
            lambda: restarted.status("vpnew").state,
            until=lambda s: s is SandboxState.PAUSED,
            within=5,
            what="the crashed sandbox kept as paused",
        )
        restarted.resume("vpnew")
        assert ok(restarted, "vpnew", "stat -c %U /n/f") == "user\n"
        restarted.discard_spares()

        report = teardown_root(root, kill=True)
        assert report.left == []
        assert mounts_under(root) == [] and loops_under(root) == []
        # A volume is its user's data: the teardown leaves its image.
        assert (root / "volumes" / volume_id / store.IMAGE).exists()
    finally:
        destroy_runtime(LocalRuntime(root, spares=0))
    assert not [line for line in open("/proc/self/mountinfo") if str(root) in line]
