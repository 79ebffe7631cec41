"""Builds and starts ``sandboxd``, the runtime's privileged C helper (launcher/c/: the
launcher daemon, see daemon.c, and the guest agent, see agent_conn.c).

The binary is named after a hash of its source, and so is the daemon's socket: after an
upgrade the new binary starts a daemon of its own while the old one keeps reaping the
sandboxes it launched.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from e2bfacade.runtime.base import RuntimeUnavailable
from e2bfacade.runtime.local import seccomp

SOURCE_DIR = Path(__file__).with_name("launcher") / "c"
# Every C file of the folder is compiled together into one static binary, and all of them
# (and the headers) name it: a file added there can be neither left out nor left unhashed.
SOURCES = tuple(sorted(SOURCE_DIR.glob("*.c")))
HEADERS = tuple(sorted(SOURCE_DIR.glob("*.h")))


# The only environment sandboxd and the helpers it runs get.
CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


# A directory where compiled helpers are kept by their source hash for every root of the
# host (unset: none). A host runs one root, so a deployment needs none; a test suite makes a
# root per test module, and compiling is 1.9 s of CPU each time. It must be root's own and
# writable by nobody else (the helper runs as root): any other directory is not used.
CACHE_ENV = "E2BFACADE_SANDBOXD_CACHE"


def _cache_dir() -> Path | None:
    name = os.environ.get(CACHE_ENV)
    if not name:
        return None
    path = Path(name)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError:
        return None
    if not path.is_dir() or path.is_symlink() or info.st_uid != os.geteuid():
        return None
    return path if info.st_mode & 0o022 == 0 else None


def _publish(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` under a temp name, then rename: readers see the whole
    file or none."""
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def ensure_binary(root: Path) -> Path:
    """The compiled helper for the current source, compiling it once if needed (or taking
    it from the host's cache, when one is set)."""
    binary = root / "bin" / f"sandboxd-{source_hash()}"
    if binary.exists():
        return binary
    cache = _cache_dir()
    if cache is not None and (cache / binary.name).is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        _publish(cache / binary.name, binary)
        return binary
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeUnavailable(
            "the local runtime compiles its helper with gcc, which is not installed "
            "(scripts/setup.sh installs gcc and libc6-dev)"
        )
    binary.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (threads of one process too: each open() is its own lock), and
    # a temp name no other builder uses; the rename then publishes a finished file only.
    with open(binary.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        fd, tmp_name = tempfile.mkstemp(dir=binary.parent, prefix=f".{binary.name}.")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            # Static, so the helper never depends on the host's libc after an upgrade.
            proc = subprocess.run(
                [cc, "-static", "-O2", "-Wall", "-o", str(tmp), *map(str, SOURCES), "-lseccomp"],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise RuntimeUnavailable(
                    "cannot compile sandboxd (are libc6-dev and libseccomp-dev installed? "
                    f"scripts/setup.sh installs them): {proc.stderr}"
                )
            os.chmod(tmp, 0o755)
            os.replace(tmp, binary)
        finally:
            tmp.unlink(missing_ok=True)
    if cache is not None:
        _publish(binary, cache / binary.name)
    return binary


T = TypeVar("T")


def run_helper(start: Callable[[], T]) -> T:
    """``start()``, which executes the helper, again while the kernel answers ETXTBSY: a
    process this service forked while the helper's file was being written (a copy from the
    cache, a compile) holds a descriptor of it open for writing until its own exec. That
    lasts milliseconds, and the helper is written once per deployment."""
    for attempt in range(200):
        try:
            return start()
        except OSError as exc:
            if exc.errno != errno.ETXTBSY or attempt == 199:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")


_filters: dict[Path, Path] = {}


def ensure_seccomp(root: Path) -> Path:
    """The guests' seccomp filter (see seccomp.py), compiled once per policy and helper;
    remembered per process (its inputs, the profile and the source, change only with a
    deployment, which restarts the process)."""
    known = _filters.get(root)
    if known is not None and known.exists():
        return known
    _filters[root] = path = _compile_seccomp(root)
    return path


def _compile_seccomp(root: Path) -> Path:
    try:
        policy = "\n".join(seccomp.policy_lines()) + "\n"
    except seccomp.ProfileMissing as exc:
        raise RuntimeUnavailable(str(exc)) from None
    digest = hashlib.sha256((source_hash() + policy).encode()).hexdigest()[:12]
    out = root / "bin" / f"seccomp-{digest}.bpf"
    if out.exists():
        return out
    binary = ensure_binary(root)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(fd)
    tmp = Path(tmp_name)
    policy_file = tmp.with_name(tmp.name + ".policy")
    try:
        policy_file.write_text(policy)
        proc = run_helper(
            lambda: subprocess.run(
                [str(binary), "seccomp-compile", str(policy_file), str(tmp)],
                capture_output=True,
                text=True,
                env=CLEAN_ENV,
            )
        )
        if proc.returncode != 0:
            raise RuntimeUnavailable(f"cannot compile the seccomp filter: {proc.stderr}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)  # the same bytes whoever wins a race
    finally:
        tmp.unlink(missing_ok=True)
        policy_file.unlink(missing_ok=True)
    return out


def socket_path(root: Path) -> Path:
    return root / "run" / f"sandboxd-{source_hash()}.sock"


def _connectable(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def ensure_daemon(root: Path) -> Path:
    """The socket of a live sandboxd, starting one if none answers. Safe from many processes."""
    path = socket_path(root)
    if _connectable(path):
        return path
    binary = ensure_binary(root)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path.parent / "sandboxd.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter at a time; the others then connect
        if _connectable(path):
            return path
        log = open(root / "run" / "sandboxd.log", "ab")  # noqa: SIM115 - handed to the child
        # A new session detaches the daemon from the caller's terminal and process group, so
        # a gunicorn restart or a test runner's exit never takes the sandboxes down with it.
        run_helper(
            lambda: subprocess.Popen(
                [str(binary), "daemon", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
                # Nothing of the service's environment (it may hold secrets) reaches the
                # daemon, and through it every sandbox's init: whose environ the guest reads.
                env=CLEAN_ENV,
            )
        )
        log.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if _connectable(path):
                return path
            time.sleep(0.002)
    raise RuntimeUnavailable(f"sandboxd did not start; see {root / 'run' / 'sandboxd.log'}")
