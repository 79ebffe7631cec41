"""The host's image cache of system-template builds (templates/builds/image_cache.py): a
build of the system team keeps its image there, a build of the same inputs on a root
without it restores exactly that image (same layers, files and metadata) without running a
step, a changed input builds anew, an entry that fails its digest check is removed and
built again, concurrent fillers make one entry, and the cache is pruned like the others.

Real builds on the run's own root (get_runtime), real PostgreSQL or SQLite; "a new root"
is this root with the template's images and layer-cache rows removed."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import stat
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from e2bfacade.models import system_team
from e2bfacade.runtime.base import ImageInUse
from e2bfacade.runtime.local import HostRuntime
from e2bfacade.sandbox_runtime import get_runtime
from templates.builds import caches, image_cache, worker
from templates.builds import files as build_files
from templates.builds.executor import image_namespace
from templates.builds.services import build_submit_system
from templates.models import BuildLogEntry, BuildStatus, LayerCacheEntry, Template, TemplateBuild

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "cache-probe"
FILES_HASH = "a" * 64
# A layer with what a restore must carry exactly: owners, setuid, a hard link, a symlink, a
# sparse file, a user xattr, a whiteout over a file of base's and an opaque directory over
# one of base's, and slow enough (LAYER_AFTER_SECONDS) to be a layer of its own.
SHAPES = """set -eu
mkdir -p /opt/probe/dir
printf 'set-uid' > /opt/probe/suid && chmod 4755 /opt/probe/suid
ln /opt/probe/suid /opt/probe/hard && ln -s suid /opt/probe/soft
truncate -s 8M /opt/probe/sparse && chown 1000:1000 /opt/probe/sparse
python3 -c "import os; os.setxattr('/opt/probe/dir', 'user.e2b', b'kept')"
rm /etc/hostname
rm -rf /etc/ssl && mkdir /etc/ssl && echo only > /etc/ssl/only
sleep 2.2"""


def _body(run: str = SHAPES) -> dict[str, Any]:
    return {
        "fromTemplate": "base",
        "steps": [
            {"type": "COPY", "args": ["files", "/opt/probe/files/", "root"],
             "filesHash": FILES_HASH},
            {"type": "RUN", "args": [run, "root"]},
            {"type": "ENV", "args": ["PROBE", "yes"]},
            {"type": "WORKDIR", "args": ["/opt/probe"]},
            {"type": "RUN", "args": ["echo done > /opt/probe/done", "root"]},
        ],
        "startCmd": "sleep 300",
        "readyCmd": "test -e /opt/probe/done",
    }  # fmt: skip


def _archive(text: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo("files/hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(settings, "TEMPLATE_IMAGE_CACHE_DIR", tmp_path / "images")
    return tmp_path / "images"


@pytest.fixture
def rt() -> HostRuntime:
    runtime = get_runtime()
    if not isinstance(runtime, HostRuntime):
        pytest.skip("the image cache keeps the local drivers' images")
    return runtime


def _build(body: dict[str, Any] | None = None, files: str = "hello") -> TemplateBuild:
    """A system build of ALIAS (from ``body``, copying an archive of ``files``), run here
    to its end, as build_code_interpreter runs one."""
    team = system_team()
    # The migration's row (a transactional test's flush removes it).
    Template.objects.get_or_create(
        template_id="base",
        defaults={"alias": "base", "image_id": "base", "team": None, "kind": "template"},
    )
    data = _archive(files)
    build_files.store_own(team.pk, FILES_HASH, io.BytesIO(data), len(data))
    template, _ = Template.objects.get_or_create(
        template_id=ALIAS, defaults={"alias": ALIAS, "team": None, "image_id": ""}
    )
    build = build_submit_system(
        template=template, team=team, body=body or _body(), tags=["default"],
        cpu_count=1, memory_mb=512,
    )  # fmt: skip
    owner = worker.new_owner()
    claimed = worker.claim_build(build.pk, owner)
    assert claimed is not None
    worker.run(claimed, owner)
    build.refresh_from_db()
    assert build.status == BuildStatus.READY, (build.reason, _log(build)[-20:])
    return build


def _log(build: TemplateBuild) -> list[str]:
    return list(
        BuildLogEntry.objects.filter(build=build).order_by("seq").values_list("message", flat=True)
    )


def _ran_steps(build: TemplateBuild) -> bool:
    return any(m.startswith("[builder 2/5] RUN") for m in _log(build))


def _forget(rt: HostRuntime) -> None:
    """What a new sandbox root has of the team's images and layers: nothing."""
    namespace = image_namespace(system_team().pk)
    LayerCacheEntry.objects.all().delete()
    for _ in range(20):
        left = [i for i in rt.list_images() if i.startswith(namespace)]
        if not left:
            return
        for image_id in left:
            try:
                rt.delete_image(image_id)
            except ImageInUse:
                pass  # a layer under another: removed next round
    raise AssertionError(f"images left: {left}")


def _fingerprint(rt: HostRuntime, image_id: str) -> list[Any]:
    """Every layer above base of ``image_id``: its id, its image.json but for when it was
    made, and every file with its type, mode, owners, size, times, link target, device,
    content digest and extended attributes."""
    out: list[Any] = []
    for meta in rt.images.chain(image_id):
        if meta.image_id == "base":
            continue
        root = rt.images.layer(meta.image_id)
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            for name in sorted([*dirnames, *filenames]):
                path = Path(dirpath) / name
                st = path.lstat()
                what: Any = None
                if stat.S_ISREG(st.st_mode):
                    what = hashlib.sha256(path.read_bytes()).hexdigest()
                elif stat.S_ISLNK(st.st_mode):
                    what = os.readlink(path)
                xattrs = sorted(
                    (n, os.getxattr(path, n, follow_symlinks=False))
                    for n in os.listxattr(path, follow_symlinks=False)
                )
                files.append(
                    (str(path.relative_to(root)), st.st_mode, st.st_uid, st.st_gid, st.st_size,
                     st.st_mtime_ns, st.st_rdev, st.st_nlink, st.st_blocks, what, xattrs)
                )  # fmt: skip
        files.sort()
        out.append((dataclasses.replace(meta, created=0.0), files))
    return out


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(p for p in cache_dir.iterdir() if not p.name.startswith("."))


@pytest.fixture
def built(rt: HostRuntime, cache_dir: Path) -> Iterator[tuple[TemplateBuild, list[Any]]]:
    """A cold build (no entry): its build and its image's fingerprint."""
    build = _build()
    yield build, _fingerprint(rt, build.image_id)
    _forget(rt)


def test_a_system_build_keeps_its_image_in_the_host_cache(
    built: tuple[TemplateBuild, list[Any]], cache_dir: Path
) -> None:
    build, fingerprint = built
    assert _ran_steps(build)
    (entry,) = _entries(cache_dir)
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["made_by"] == str(build.build_id)
    # Every layer above base, bottom first, the final one with the start command.
    assert len(manifest["layers"]) == len(fingerprint) >= 2
    assert manifest["layers"][-1]["meta"]["start"]["argv"][-1] == "sleep 300"
    kept = image_cache.read_log(entry)
    assert sum(1 for m in kept if m.startswith("[builder 2/5] RUN")) == 1
    assert any(m.startswith("[builder 2/5] RUN set -eu\nmkdir -p /opt/probe/dir") for m in kept)
    assert any("Kept in the host's image cache" in m for m in _log(build))
    # The shapes the layer must carry are in it (so the comparison below compares them).
    files = {f[0]: f for _, layer in fingerprint for f in layer}
    assert files["opt/probe/suid"][1] & stat.S_ISUID and files["opt/probe/suid"][7] == 2
    assert dict(files["opt/probe/dir"][10]) == {"user.e2b": b"kept"}
    assert stat.S_ISCHR(files["etc/hostname"][1]) and files["etc/hostname"][6] == 0
    assert ("user.overlay.opaque", b"y") in files["etc/ssl"][10]


def test_a_new_root_restores_exactly_the_image_the_build_made(
    rt: HostRuntime, built: tuple[TemplateBuild, list[Any]]
) -> None:
    first, fingerprint = built
    _forget(rt)
    began = time.monotonic()
    again = _build()
    took = time.monotonic() - began
    assert not _ran_steps(again), _log(again)
    log = _log(again)
    assert any("Restored from the host's image cache" in m for m in log), log
    assert any(m.startswith("CACHED [builder 2/5] RUN") for m in log), log
    # The same layers (ids, files, metadata), the same image id, and the build's context.
    assert again.image_id == first.image_id
    assert _fingerprint(rt, again.image_id) == fingerprint
    info = rt.image_info(again.image_id)
    assert info.start is not None and info.start.argv[-1] == "sleep 300"
    assert info.start.cwd == "/opt/probe" and info.start.env.get("PROBE") == "yes"
    assert again.context == first.context
    # The layer cache knows the restored layers, as after the build.
    assert LayerCacheEntry.objects.filter(image_id=again.image_id).exists()
    assert took < 30, took


def test_a_changed_input_misses_and_builds(
    rt: HostRuntime, built: tuple[TemplateBuild, list[Any]], cache_dir: Path
) -> None:
    first, _ = built
    _forget(rt)
    # The copied file's bytes change, its files hash does not: the archive's digest is in
    # the key, not the hash the client gave it.
    changed = _build(files="hello, changed")
    assert _ran_steps(changed), _log(changed)
    assert len(_entries(cache_dir)) == 2
    _forget(rt)
    # A changed step likewise.
    other = _build(_body(SHAPES.replace("sleep 2.2", "sleep 2.3")))
    assert _ran_steps(other), _log(other)
    assert len(_entries(cache_dir)) == 3


def test_the_key_changes_with_the_base_the_code_the_runtime_and_the_internet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kw: dict[str, Any] = {"final_key": "k", "base": "base", "runtime": "local", "internet": False}
    first = image_cache.key(**kw)
    assert image_cache.key(**kw) == first
    assert image_cache.key(**{**kw, "final_key": "k2"}) != first
    assert image_cache.key(**{**kw, "runtime": "gvisor"}) != first
    assert image_cache.key(**{**kw, "internet": True}) != first
    monkeypatch.setattr(image_cache, "base_digest", lambda: "another host's Debian")
    assert image_cache.key(**kw) != first
    monkeypatch.undo()
    monkeypatch.setattr(image_cache, "code_digest", lambda: "another builder")
    assert image_cache.key(**kw) != first


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "archive gone", "no manifest"])
def test_a_corrupt_or_partial_entry_is_detected_removed_and_built_again(
    rt: HostRuntime, built: tuple[TemplateBuild, list[Any]], cache_dir: Path, damage: str
) -> None:
    first, fingerprint = built
    (entry,) = _entries(cache_dir)
    archive = entry / "0.tar"
    if damage == "flipped byte":
        with open(archive, "r+b") as f:
            f.seek(1024)
            byte = f.read(1)
            f.seek(1024)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "truncated":
        os.truncate(archive, archive.stat().st_size // 2)
    elif damage == "archive gone":
        archive.unlink()
    else:
        (entry / "manifest.json").unlink()
    _forget(rt)
    again = _build()
    assert _ran_steps(again), _log(again)
    assert _fingerprint(rt, again.image_id)[0][0] == fingerprint[0][0]
    # The entry was made anew, and passes its check.
    (entry,) = _entries(cache_dir)
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["made_by"] == str(again.build_id)
    cache = image_cache.for_build(
        rt, team_id=system_team().pk, system=True, base="base", internet=False
    )
    assert cache is not None
    cache._checked(entry, manifest["key"])


def test_concurrent_fillers_make_one_entry(
    rt: HostRuntime, built: tuple[TemplateBuild, list[Any]], cache_dir: Path
) -> None:
    first, _ = built
    cache = image_cache.for_build(
        rt, team_id=system_team().pk, system=True, base="base", internet=False
    )
    assert cache is not None
    key = "f" * 64
    start = threading.Barrier(3)
    results: list[bool] = []

    def fill() -> None:
        start.wait()
        results.append(cache.store(key, first.image_id, [], log=["x"], made_by="race"))

    threads = [threading.Thread(target=fill) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True, True, True]
    made = [p for p in cache_dir.iterdir() if p.name.startswith(key[:32])]
    assert made == [cache.entry(key)]
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".making-")]
    manifest = cache._checked(cache.entry(key), key)
    assert manifest["made_by"] == "race"


def test_the_cache_is_pruned_by_age_and_size_but_never_under_a_held_lock(
    built: tuple[TemplateBuild, list[Any]], cache_dir: Path
) -> None:
    (entry,) = _entries(cache_dir)
    (listed,) = caches.image_entries(cache_dir)
    assert listed.path == entry and listed.size > 0
    later = time.time() + 40 * caches.DAY
    rt = get_runtime()
    assert isinstance(rt, HostRuntime)
    cache = image_cache.for_build(
        rt, team_id=system_team().pk, system=True, base="base", internet=False
    )
    assert cache is not None
    key = json.loads((entry / "manifest.json").read_text())["key"]
    with cache.locked(key):  # a restore or a filler holds it
        assert caches.prune([listed], keep_seconds=caches.DAY, max_bytes=1, now=later) == []
    assert entry.is_dir()
    # Over the size (and out of the grace hour): the least recently used goes.
    assert caches.prune([listed], keep_seconds=100 * caches.DAY, max_bytes=1, now=later) == [entry]
    assert not entry.exists()


def test_only_the_system_teams_builds_from_base_use_the_cache(rt: HostRuntime) -> None:
    for_build = image_cache.for_build
    assert for_build(rt, team_id=1, system=False, base="base", internet=False) is None
    assert for_build(rt, team_id=1, system=True, base="pulled-x", internet=False) is None
    assert for_build(rt, team_id=1, system=True, base="base", internet=False) is not None
