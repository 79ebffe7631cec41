"""The ``local`` runtime: real Linux sandboxes on this host.

Layout under ``SANDBOX_ROOT`` (all state is on disk, so a restarted service adopts the
sandboxes that are running and reaps the ones that are not)::

    images/<id>/rootfs        a read-only lower layer (template or snapshot)
    images/<id>/image.json    {"parent": <id>|null, "host_binds": [...], "size": n}
    images/<id>/layer.tar     a snapshot's archive (snapshots only)
    sandboxes/<id>/upper      the sandbox's writable layer
    sandboxes/<id>/state.json written last: its presence means "created"
    locks/<nn>.lock           per-id serialisation across threads and processes
    run/sandboxd-*.sock       the launcher/reaper daemon (see sandboxd.c)

Isolation: own pid, mount, uts, ipc and net (loopback only) namespaces; an overlay root
over the image chain; cgroup memory, pid and cpu limits; a reaping PID 1; capabilities
reduced to Docker's default set minus MKNOD; /proc/sys and friends read-only. There is no
user namespace: guest root is host root with those capabilities removed.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from e2bfacade.runtime import build, layers
from e2bfacade.runtime.base import (
    CreateRefused,
    ExecResult,
    ImageInfo,
    ImageInUse,
    ImageNotFound,
    Metrics,
    RuntimeConflict,
    RuntimeUnavailable,
    SandboxInfo,
    SandboxNotFound,
    SandboxSpec,
    SandboxState,
    check_id,
)
from e2bfacade.runtime.cgroups import Cgroups, detect

BASE_IMAGE = "base"
LOCK_STRIPES = 256
# The base template shows the host's programs and libraries, read-only; never its /etc,
# /root, /home or /var. These /etc entries are copied because programs need them and they
# hold nothing secret (alternatives symlinks, the dynamic linker cache, public CA certs).
HOST_ETC_COPIES = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl/certs",
    "profile",
    "bash.bashrc",
    "nsswitch.conf",
    "localtime",
    "os-release",
    "debian_version",
)
GUEST_USER_UID = 1000
HOSTNAME_PATTERN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?")


def _proc_starttime(pid: int) -> int | None:
    """The kernel start time of ``pid``: with the pid it identifies a process uniquely."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class LocalRuntime:
    def __init__(self, root: Path, cgroup_version: str = "auto") -> None:
        if os.geteuid() != 0:
            raise RuntimeUnavailable(
                "the local sandbox runtime needs root (it creates namespaces, overlay mounts "
                "and cgroups); run the service as root or choose another SANDBOX_RUNTIME"
            )
        for ns in ("pid", "mnt", "uts", "ipc", "net"):
            if not os.path.exists(f"/proc/self/ns/{ns}"):
                raise RuntimeUnavailable(f"this kernel has no {ns} namespaces")
        if "overlay" not in Path("/proc/filesystems").read_text():
            raise RuntimeUnavailable("this kernel has no overlayfs (modprobe overlay)")
        self.root = root
        for sub in ("images", "sandboxes", "locks", "run", "bin"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        os.chmod(root / "images", 0o700)
        os.chmod(root / "sandboxes", 0o700)
        # A group per runtime root, so a test runtime never touches another one's sandboxes.
        digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]
        self.cgroups: Cgroups = detect(f"e2bfacade-{digest}", cgroup_version)

    # ----------------------------------------------------------------------- paths, locks
    def _sandbox_dir(self, sandbox_id: str) -> Path:
        return self.root / "sandboxes" / check_id(sandbox_id, "sandbox id")

    def _image_dir(self, image_id: str) -> Path:
        return self.root / "images" / check_id(image_id, "image id")

    @contextlib.contextmanager
    def _locked(self, kind: str, ident: str, blocking: bool = True) -> Iterator[bool]:
        """Serialise operations on one id across threads and processes (flock on a striped
        file; each call opens its own descriptor, so threads exclude each other too)."""
        # One file set per kind: a sandbox lock may be held while an image lock is taken
        # (snapshot), and two stripes of one file would deadlock on each other.
        stripe = zlib.crc32(ident.encode()) % LOCK_STRIPES
        with open(self.root / "locks" / f"{kind}-{stripe:03d}.lock", "w") as f:
            flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
            try:
                fcntl.flock(f, flags)
            except BlockingIOError:
                yield False
                return
            yield True

    # ----------------------------------------------------------------------------- images
    def _read_image(self, image_id: str) -> dict[str, object]:
        try:
            return json.loads((self._image_dir(image_id) / "image.json").read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            raise ImageNotFound(f"image {image_id!r} does not exist") from None

    def image_info(self, image_id: str) -> ImageInfo:
        meta = self._read_image(image_id)
        return ImageInfo(
            image_id=image_id,
            parent=meta.get("parent"),  # type: ignore[arg-type]
            size_bytes=int(meta.get("size", 0)),  # type: ignore[call-overload]
            host_binds=tuple(meta.get("host_binds", ())),  # type: ignore[arg-type]
            created_at=float(meta.get("created", 0)),  # type: ignore[arg-type]
        )

    def _chain(self, image_id: str) -> builtins.list[ImageInfo]:
        """The image and its ancestors, top layer first."""
        chain: list[ImageInfo] = []
        current: str | None = image_id
        while current is not None:
            info = self.image_info(current)
            chain.append(info)
            current = info.parent
        return chain

    def _publish_image(self, image_id: str, build_fn: object) -> ImageInfo:
        """Build an image in a temp dir and rename it into place: readers never see half."""
        final = self._image_dir(image_id)
        with self._locked("image", image_id):
            if (final / "image.json").exists():
                return self.image_info(image_id)
            tmp = final.with_name(f".{image_id}.building")
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "rootfs").mkdir(parents=True)
            try:
                meta = build_fn(tmp)  # type: ignore[operator]
                meta["size"] = layers.tree_size(tmp / "rootfs")
                meta["created"] = time.time()
                (tmp / "image.json").write_text(json.dumps(meta))
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return self.image_info(image_id)

    def ensure_base_image(self) -> ImageInfo:
        def make(tmp: Path) -> dict[str, object]:
            rootfs = tmp / "rootfs"
            binds = ["/usr"]
            for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
                host = Path("/") / top
                if host.is_symlink():  # merged-/usr hosts: /bin -> usr/bin
                    os.symlink(os.readlink(host), rootfs / top)
                elif host.is_dir():
                    binds.append(str(host))
            for d in (
                "usr",
                "etc",
                "home",
                "root",
                "tmp",
                "var/tmp",
                "var/log",
                "var/cache",
                "var/lib",
                "opt",
                "mnt",
                "srv",
                "proc",
                "sys",
                "dev",
                "run",
            ):
                (rootfs / d).mkdir(parents=True, exist_ok=True)
            os.chmod(rootfs / "tmp", 0o1777)
            os.chmod(rootfs / "var/tmp", 0o1777)
            os.chmod(rootfs / "root", 0o700)
            home = rootfs / "home/user"
            home.mkdir()
            os.chown(home, GUEST_USER_UID, GUEST_USER_UID)
            etc = rootfs / "etc"
            for name in HOST_ETC_COPIES:
                src = Path("/etc") / name
                dst = etc / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                if src.is_symlink():
                    os.symlink(os.readlink(src), dst)
                elif src.is_dir():
                    shutil.copytree(src, dst, symlinks=True)
                elif src.is_file():
                    shutil.copy2(src, dst)
            uid = GUEST_USER_UID
            (etc / "passwd").write_text(
                "root:x:0:0:root:/root:/bin/bash\n"
                f"user:x:{uid}:{uid}:user:/home/user:/bin/bash\n"
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            )
            (etc / "group").write_text(
                f"root:x:0:\nsudo:x:27:user\nuser:x:{uid}:\nnogroup:x:65534:\n"
            )
            (etc / "shadow").write_text("root:*:19000:0:99999:7:::\nuser:*:19000:0:99999:7:::\n")
            os.chmod(etc / "shadow", 0o640)
            (etc / "hostname").write_text("e2b\n")
            (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
            (etc / "resolv.conf").write_text("")
            return {"parent": None, "host_binds": binds}

        return self._publish_image(BASE_IMAGE, make)

    def import_image(self, image_id: str, tar_path: str) -> ImageInfo:
        if not os.path.isfile(tar_path):
            raise ImageNotFound(f"rootfs archive {tar_path!r} does not exist")

        def make(tmp: Path) -> dict[str, object]:
            layers.extract_layer(Path(tar_path), tmp / "rootfs")
            # Mount points the runtime needs, made here so they never land in a sandbox's
            # writable layer (and so in its snapshots). Never through a symlink: the
            # archive's links point into the guest's tree, not the host's.
            for d in ("proc", "sys", "dev", "run", "tmp", "home/user"):
                p = tmp / "rootfs"
                for part in Path(d).parts:
                    p = p / part
                    if p.is_symlink() or (p.exists() and not p.is_dir()):
                        raise CreateRefused(f"/{d} in {tar_path!r} is not a directory")
                    if not p.exists():
                        p.mkdir()
            return {"parent": None, "host_binds": []}

        try:
            return self._publish_image(image_id, make)
        except (OSError, ValueError, tarfile.TarError) as exc:
            raise CreateRefused(f"cannot import {tar_path!r}: {exc}") from exc

    def delete_image(self, image_id: str) -> bool:
        final = self._image_dir(image_id)
        with self._locked("image", image_id):
            if not final.exists():
                return False
            children = [
                p.name
                for p in (self.root / "images").iterdir()
                if not p.name.startswith(".")
                and p.name != image_id
                and self._read_image_safe(p.name).get("parent") == image_id
            ]
            users = [s.sandbox_id for s in self.list() if image_id in self._chain_ids(s.image_id)]
            if children or users:
                raise ImageInUse(
                    f"image {image_id!r} is still used by "
                    + ", ".join([f"sandbox {u}" for u in users] + [f"image {c}" for c in children])
                )
            tomb = final.with_name(f".{image_id}.deleting")
            os.rename(final, tomb)
            shutil.rmtree(tomb)
            return True

    def list_images(self) -> builtins.list[str]:
        return sorted(
            p.name
            for p in (self.root / "images").iterdir()
            if not p.name.startswith(".") and (p / "image.json").exists()
        )

    def _read_image_safe(self, image_id: str) -> dict[str, object]:
        try:
            return self._read_image(image_id)
        except ImageNotFound:
            return {}

    def _chain_ids(self, image_id: str) -> builtins.list[str]:
        try:
            return [i.image_id for i in self._chain(image_id)]
        except ImageNotFound:
            return [image_id]

    # -------------------------------------------------------------------------- sandboxes
    def _state(self, sandbox_id: str) -> dict[str, object] | None:
        try:
            return json.loads((self._sandbox_dir(sandbox_id) / "state.json").read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    def _info(self, state: dict[str, object], adopted: bool = False) -> SandboxInfo:
        sid = str(state["sandbox_id"])
        pid = int(state["init_pid"])  # type: ignore[call-overload]
        if _proc_starttime(pid) != state["init_start"]:
            sandbox_state = SandboxState.DEAD
        elif self.cgroups.is_frozen(sid):
            sandbox_state = SandboxState.PAUSED
        else:
            sandbox_state = SandboxState.RUNNING
        return SandboxInfo(
            sandbox_id=sid,
            image_id=str(state["image_id"]),
            state=sandbox_state,
            init_pid=pid,
            cpu_count=int(state["cpu_count"]),  # type: ignore[call-overload]
            memory_mb=int(state["memory_mb"]),  # type: ignore[call-overload]
            pids_max=int(state["pids_max"]),  # type: ignore[call-overload]
            created_at=float(state["created_at"]),  # type: ignore[arg-type]
            adopted=adopted,
        )

    def create(self, spec: SandboxSpec) -> SandboxInfo:
        """Start the sandbox ``spec.sandbox_id``, or adopt it if it already runs.

        Safe to retry and to call concurrently with the same id: exactly one sandbox
        results. A failure rolls back everything it made and raises :class:`CreateRefused`,
        so the caller knows that nothing was allocated.
        """
        check_id(spec.sandbox_id, "sandbox id")
        for name, value, low, high in (
            ("cpu_count", spec.cpu_count, 1, 64),
            ("memory_mb", spec.memory_mb, 16, 1 << 20),
            ("pids_max", spec.pids_max, 8, 1 << 22),
        ):
            if not low <= value <= high:
                raise CreateRefused(f"{name} must be between {low} and {high}, got {value}")
        if spec.hostname and not HOSTNAME_PATTERN.fullmatch(spec.hostname):
            raise CreateRefused(f"hostname {spec.hostname!r} is not a valid host name")
        with self._locked("sandbox", spec.sandbox_id):
            state = self._state(spec.sandbox_id)
            if state is not None:
                info = self._info(state, adopted=True)
                if info.state is not SandboxState.DEAD:
                    if info.image_id != spec.image_id:
                        raise RuntimeConflict(
                            f"sandbox {spec.sandbox_id} exists from image {info.image_id}, "
                            f"not {spec.image_id}"
                        )
                    return info
            # Dead, or half-made by a creator that crashed before writing state.json (we
            # hold the id's lock, so no creator is running): nobody was ever handed this
            # sandbox, so clear it and start afresh.
            self._destroy(spec.sandbox_id)
            chain = self._chain(spec.image_id)  # ImageNotFound before anything is made
            try:
                return self._start(spec, chain)
            except BaseException as exc:
                self._destroy(spec.sandbox_id)
                if isinstance(exc, (CreateRefused, RuntimeUnavailable)):
                    raise
                if isinstance(exc, OSError):
                    raise CreateRefused(f"cannot create sandbox {spec.sandbox_id}: {exc}") from exc
                raise

    def _start(self, spec: SandboxSpec, chain: builtins.list[ImageInfo]) -> SandboxInfo:
        d = self._sandbox_dir(spec.sandbox_id)
        for sub in ("upper", "work", "rootfs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.cgroups.create(
            spec.sandbox_id,
            cpu_count=spec.cpu_count,
            memory_mb=spec.memory_mb,
            pids_max=spec.pids_max,
        )
        binds = [b for info in chain for b in info.host_binds]
        request = [
            f"rootfs={d / 'rootfs'}",
            "lower=" + ":".join(str(self._image_dir(i.image_id) / "rootfs") for i in chain),
            f"upper={d / 'upper'}",
            f"work={d / 'work'}",
            f"hostname={spec.hostname or spec.sandbox_id}",
            *(f"cgroup={p}" for p in self.cgroups.procs_files(spec.sandbox_id)),
            *(f"leave={p}" for p in self.cgroups.root_procs_files()),
            *(f"bind={b}:{b}" for b in binds),
        ]
        pid = self._daemon_create(request)
        start = _proc_starttime(pid)
        if start is None:
            raise CreateRefused(f"sandbox {spec.sandbox_id} exited right after it started")
        state: dict[str, object] = {
            "sandbox_id": spec.sandbox_id,
            "image_id": spec.image_id,
            "init_pid": pid,
            "init_start": start,
            "cpu_count": spec.cpu_count,
            "memory_mb": spec.memory_mb,
            "pids_max": spec.pids_max,
            "created_at": time.time(),
        }
        _write_json(d / "state.json", state)  # the commit point: from here it exists
        return self._info(state)

    def _daemon_create(self, request: builtins.list[str]) -> int:
        if any("\0" in item for item in request):  # NUL separates items on the wire
            raise CreateRefused("a launch parameter contains a NUL byte")
        payload = b"".join(item.encode() + b"\0" for item in request) + b"\0"
        sock_path = build.ensure_daemon(self.root)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(sock_path))
            s.sendall(payload)
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
        text = reply.decode(errors="replace").strip()
        if text.startswith("OK "):
            return int(text[3:])
        raise CreateRefused(f"sandbox launch failed: {text.removeprefix('ERR ') or 'no reply'}")

    def _destroy(self, sandbox_id: str) -> bool:
        """Kill every process of the sandbox and remove its groups and files. Caller holds
        the id's lock. Returns whether anything existed."""
        d = self._sandbox_dir(sandbox_id)
        existed = d.exists() or self.cgroups.exists(sandbox_id)
        if self.cgroups.exists(sandbox_id):
            self.cgroups.kill_all(sandbox_id)
            if not self.cgroups.wait_empty(sandbox_id):
                raise RuntimeUnavailable(f"sandbox {sandbox_id}: processes survived SIGKILL")
            self.cgroups.remove(sandbox_id)
        if d.exists():
            # Rename first: a crash halfway through never leaves a half-deleted sandbox dir
            # that looks like a live one.
            tomb = d.with_name(f".{sandbox_id}.{os.getpid()}.deleting")
            os.rename(d, tomb)
            shutil.rmtree(tomb, ignore_errors=True)
        return existed

    def status(self, sandbox_id: str) -> SandboxInfo:
        state = self._state(sandbox_id)
        if state is None:
            raise SandboxNotFound(f"sandbox {sandbox_id} does not exist")
        return self._info(state)

    def list(self) -> builtins.list[SandboxInfo]:
        out = []
        for p in sorted((self.root / "sandboxes").iterdir()):
            if p.name.startswith("."):
                continue
            state = self._state(p.name)
            if state is not None:
                out.append(self._info(state))
        return out

    def _require(self, sandbox_id: str, *allowed: SandboxState) -> SandboxInfo:
        info = self.status(sandbox_id)
        if info.state not in allowed:
            raise RuntimeConflict(f"sandbox {sandbox_id} is {info.state}")
        return info

    def pause(self, sandbox_id: str) -> None:
        """Freeze every process of the sandbox; memory stays as it is. Not idempotent by
        design: pausing a paused sandbox raises RuntimeConflict (E2B answers 409)."""
        with self._locked("sandbox", sandbox_id):
            self._require(sandbox_id, SandboxState.RUNNING)
            self.cgroups.freeze(sandbox_id)

    def resume(self, sandbox_id: str) -> None:
        with self._locked("sandbox", sandbox_id):
            self._require(sandbox_id, SandboxState.PAUSED)
            self.cgroups.thaw(sandbox_id)

    def snapshot(self, sandbox_id: str, image_id: str) -> ImageInfo:
        """Capture the sandbox's files as image ``image_id`` (idempotent by that id). The
        sandbox is frozen while its layer is archived, so the snapshot is consistent."""
        check_id(image_id, "image id")
        with self._locked("sandbox", sandbox_id):
            info = self._require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
            if (self._image_dir(image_id) / "image.json").exists():
                return self.image_info(image_id)
            upper = self._sandbox_dir(sandbox_id) / "upper"

            def make(tmp: Path) -> dict[str, object]:
                froze = info.state is SandboxState.RUNNING
                if froze:
                    self.cgroups.freeze(sandbox_id)
                try:
                    layers.archive_layer(upper, tmp / "layer.tar")
                finally:
                    if froze:
                        self.cgroups.thaw(sandbox_id)
                layers.extract_layer(tmp / "layer.tar", tmp / "rootfs")
                return {"parent": info.image_id, "host_binds": []}

            return self._publish_image(image_id, make)

    def kill(self, sandbox_id: str) -> bool:
        """Kill the sandbox and delete its files. Missing is fine: returns False."""
        check_id(sandbox_id, "sandbox id")
        with self._locked("sandbox", sandbox_id):
            return self._destroy(sandbox_id)

    def metrics(self, sandbox_id: str) -> Metrics:
        info = self._require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
        cpu_ns, mem_used, cache, limit = self.cgroups.stats(sandbox_id)
        d = self._sandbox_dir(sandbox_id)
        # CPU % over the interval since the previous sample (or since start).
        now = time.time()
        sample_file = d / "cpu.sample"
        try:
            prev_t, prev_ns = (float(x) for x in sample_file.read_text().split())
        except (FileNotFoundError, ValueError):
            prev_t, prev_ns = info.created_at, 0.0
        sample_file.write_text(f"{now} {cpu_ns}")
        elapsed = max(now - prev_t, 1e-6)
        pct = 100.0 * (cpu_ns - prev_ns) / 1e9 / elapsed / info.cpu_count
        usage = shutil.disk_usage(d)
        return Metrics(
            cpu_count=info.cpu_count,
            cpu_used_pct=round(max(0.0, min(pct, 100.0)), 2),
            cpu_usage_ns=cpu_ns,
            mem_used=mem_used,
            mem_total=limit,
            mem_cache=cache,
            disk_used=layers.tree_size(d / "upper"),
            disk_total=usage.total,
            pids=len(self.cgroups.pids(sandbox_id)),
        )

    def exec(
        self,
        sandbox_id: str,
        argv: builtins.list[str],
        *,
        uid: int = 0,
        gid: int = 0,
        cwd: str = "/",
        stdin: bytes = b"",
        timeout: float = 30,
    ) -> ExecResult:
        """Run ``argv`` inside the sandbox and wait for it (used by tests and, later, the
        data plane). A paused sandbox refuses: its processes could not run."""
        info = self._require(sandbox_id, SandboxState.RUNNING)
        cmd = [
            str(build.ensure_binary(self.root)),
            "exec",
            str(info.init_pid),
            ",".join(self.cgroups.procs_files(sandbox_id)),
            str(uid),
            str(gid),
            cwd,
            "--",
            *argv,
        ]
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root" if uid == 0 else "/home/user",
            "LANG": "C.UTF-8",
        }
        with subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        ) as proc:
            try:
                out, err = proc.communicate(stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()  # sandboxd forwards it to the command's process group
                try:
                    proc.communicate(timeout=1)
                except subprocess.TimeoutExpired:
                    proc.kill()  # the command dies with it (PR_SET_PDEATHSIG)
                    proc.communicate()
                raise
        return ExecResult(proc.returncode, out, err)

    def reap_orphans(self) -> builtins.list[str]:
        """Remove what no live sandbox owns: groups without a sandbox, sandboxes whose init
        died, directories a crashed creator left half-made. Safe beside running creates
        (an id whose lock is held is skipped)."""
        reaped = []
        ids = {p.name for p in (self.root / "sandboxes").iterdir() if not p.name.startswith(".")}
        for sid in sorted(ids | self.cgroups.list_ids()):
            with self._locked("sandbox", sid, blocking=False) as got:
                if not got:
                    continue
                state = self._state(sid)
                if state is not None and self._info(state).state is not SandboxState.DEAD:
                    continue
                if self._destroy(sid):
                    reaped.append(sid)
        for p in (self.root / "sandboxes").iterdir():
            if p.name.endswith(".deleting"):
                shutil.rmtree(p, ignore_errors=True)
        return reaped
