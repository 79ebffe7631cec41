"""The host runtime's on-disk state: where things live under ``SANDBOX_ROOT``, per-id locks,
and the few facts about host processes the driver keeps (an init is identified by its pid
*and* its kernel start time, so a recycled pid is never mistaken for a live sandbox).

Layout::

    images/<id>/rootfs        a read-only lower layer (template or snapshot)
    images/<id>/image.json    {"parent": <id>|null, "host_binds": [...], "size": n}
    sandboxes/<id>/disk.img   the sandbox's own file system (see disks.py), mounted on
    sandboxes/<id>/disk/      its writable layer: disk/upper (and overlay's disk/work)
    sandboxes/<id>/state.json written last: its presence means "created"
    sandboxes/<id>/stage/     mount points the init uses while it builds its root
    volumes/<id>/volume.img   a volume's own file system (storage/volumes.py), mounted on
    volumes/<id>/data/        the host lazily; sandboxes mount clones of it
    ids/<slot>                the id range <slot> is held by the sandbox named inside
    ids/block.json            the root's block of host ids (see below; roots.py claims it)
    locks/<kind>-<nn>.lock    per-id serialisation across threads and processes
    run/sandboxd-*.sock       the launcher/reaper daemon (see launcher/c/daemon.c)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import resource
import select
import signal
import threading
import weakref
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from e2bfacade.runtime.base import RuntimeUnavailable, check_id
from e2bfacade.runtime.local.ids import (
    BLOCK_LOCK,
    ID_RANGE,
    ID_SLOTS,
    block_base,
    recorded_block,
)
from e2bfacade.runtime.local.net import roots
from e2bfacade.runtime.local.record import SandboxRecord

LOCK_STRIPES = 256


def proc_starttime(pid: int) -> int | None:
    """The kernel start time of ``pid``: with the pid it identifies a process uniquely."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        stat = os.read(fd, 4096).decode(errors="replace")
    except ProcessLookupError:  # it ended between the open and the read
        return None
    finally:
        os.close(fd)
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def kill_pending(pid: int) -> bool:
    """Whether ``pid`` has a SIGKILL waiting (for it or its thread group): a frozen process
    that was killed dies only when it next runs, so until a thaw it looks alive and
    frozen while it is doomed (an operator's ``kill -9`` of a frozen sandbox's processes)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return False
    bit = 1 << (signal.SIGKILL - 1)
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in ("SigPnd", "ShdPnd") and int(value.strip() or "0", 16) & bit:
            return True
    return False


class Layout:
    """Paths and locks under one ``SANDBOX_ROOT``. Opening it claims the root's block of
    host ids in the host's registry (roots.py), and holds it while the object lives;
    raises RuntimeUnavailable, naming the other root, when another root holds the block
    this one's sandboxes are owned by, or every block is held. ``claim_ids=False`` (a
    teardown, which takes no ids) claims nothing; :meth:`id_base_take` then refuses."""

    def __init__(self, root: Path, *, claim_ids: bool = True) -> None:
        self.root = root
        self._state_cache: dict[str, tuple[tuple[int, int, int], SandboxRecord]] = {}
        self._sandboxes = str(root / "sandboxes")
        for sub in ("images", "sandboxes", "locks", "run", "bin", "ids"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        # Nobody but root walks in: no other host account can read a layer, or hold one of
        # the lock files to stall the runtime.
        for path in (root, *(root / sub for sub in ("images", "sandboxes", "locks", "ids"))):
            os.chmod(path, 0o700)
        self.id_claimed = claim_ids
        if claim_ids:
            self.id_block = self._claim_block()
        else:
            try:
                self.id_block = recorded_block(root) or 0
            except ValueError as exc:
                raise RuntimeUnavailable(str(exc)) from None

    @property
    def id_block_base(self) -> int:
        """The host id of guest id 0 in this root's slot 0."""
        return block_base(self.id_block)

    def _claim_block(self) -> int:
        fd = os.open(self.root / BLOCK_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            with roots.locked(roots.ID_REGISTRY):
                # Shared, under the registry's lock: while any process of this root holds
                # it, no other root's claim takes the block from an empty root (roots.py).
                fcntl.flock(fd, fcntl.LOCK_SH)
                block = roots.claim_ids(self.root).block
        except roots.RootConflict as exc:
            os.close(fd)
            raise RuntimeUnavailable(f"host ids: {exc}") from None
        except BaseException:
            os.close(fd)
            raise
        weakref.finalize(self, os.close, fd)
        return block

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.root / "sandboxes" / check_id(sandbox_id, "sandbox id")

    def image_dir(self, image_id: str) -> Path:
        return self.root / "images" / check_id(image_id, "image id")

    def sandbox_ids(self) -> set[str]:
        """Every sandbox directory's id, made or half-made."""
        with os.scandir(self._sandboxes) as entries:
            return {e.name for e in entries if not e.name.startswith(".")}

    def read_state(self, sandbox_id: str) -> SandboxRecord | None:
        """The sandbox's record, or None while it is not (or no longer) created. A record
        naming another sandbox is a pool sandbox's whose claim did not finish
        (pools/warm.py): not created either."""
        try:
            data = json.loads((self.sandbox_dir(sandbox_id) / "state.json").read_text())
        except FileNotFoundError:
            return None
        if data.get("sandbox_id") != sandbox_id:
            return None
        return SandboxRecord.from_json(data)

    def read_state_cached(self, sandbox_id: str) -> SandboxRecord | None:
        """:meth:`read_state` for the census (the sweep, the host runtime's ``census``),
        parsed again only when the file changed (a record is only ever replaced, so a new
        file is a new inode)."""
        path = f"{self._sandboxes}/{sandbox_id}/state.json"  # a str: no Path per call
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._state_cache.pop(sandbox_id, None)
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._state_cache.get(sandbox_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        record = self.read_state(sandbox_id)
        if record is None:
            self._state_cache.pop(sandbox_id, None)
            return None
        if len(self._state_cache) > 65536:
            self._state_cache.clear()  # ids of sandboxes long gone; they come back on demand
        self._state_cache[sandbox_id] = (key, record)
        return record

    def id_base_take(self, sandbox_id: str) -> int:
        """A free id range for ``sandbox_id`` (or the one it already holds); its base.

        A slot is a file made with O_EXCL, so two creators never take the same one; the
        search starts at a hash of the id, so creates rarely meet. ``ids/<sandbox id>``
        (a symlink to the slot's number) finds it again. Caller holds the id's lock."""
        held = self.id_base_of(sandbox_id)
        if held is not None:
            return held
        if not self.id_claimed:
            raise RuntimeUnavailable(f"the runtime root {self.root} was opened to take no ids")
        start = zlib.crc32(sandbox_id.encode()) % ID_SLOTS
        for i in range(ID_SLOTS):
            slot = (start + i) % ID_SLOTS
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
                fd = os.open(self.root / "ids" / str(slot), flags, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(sandbox_id)
            os.symlink(str(slot), self.root / "ids" / f"s-{sandbox_id}")
            return self.id_block_base + slot * ID_RANGE
        raise OSError(errno.ENOSPC, f"all {ID_SLOTS} id ranges are taken")

    def id_base_of(self, sandbox_id: str) -> int | None:
        slot = self._slot_of(sandbox_id)
        return None if slot is None else self.id_block_base + slot * ID_RANGE

    def id_base_free(self, sandbox_id: str) -> None:
        """Give back the sandbox's range: only once none of its processes is left."""
        slot = self._slot_of(sandbox_id)
        if slot is not None:
            (self.root / "ids" / str(slot)).unlink(missing_ok=True)
        (self.root / "ids" / f"s-{sandbox_id}").unlink(missing_ok=True)

    def slot_move(self, old: str, new: str) -> int | None:
        """Hand ``old``'s slot to ``new`` (a pool sandbox's claim; caller holds both ids'
        lock or the claim); None when ``old`` holds none. In every state a crash may leave,
        the slot is held by one of the two and freeing both names frees it."""
        slot = self._slot_of(old)
        if slot is None:
            return None
        link = self.root / "ids" / f"s-{new}"
        link.unlink(missing_ok=True)
        os.symlink(str(slot), link)
        tmp = self.root / "ids" / f".{slot}.{os.getpid()}.tmp"
        tmp.write_text(new)
        os.replace(tmp, self.root / "ids" / str(slot))
        (self.root / "ids" / f"s-{old}").unlink(missing_ok=True)
        return slot

    def slot_holder(self, slot: int) -> str | None:
        """The sandbox holding ``slot``, or None."""
        try:
            return (self.root / "ids" / str(slot)).read_text()
        except FileNotFoundError:
            return None

    def slot_of(self, sandbox_id: str) -> int | None:
        """The slot ``sandbox_id`` holds (its id range, and its network addresses)."""
        return self._slot_of(sandbox_id)

    def _slot_of(self, sandbox_id: str) -> int | None:
        try:
            slot = int(os.readlink(self.root / "ids" / f"s-{sandbox_id}"))
            holder = (self.root / "ids" / str(slot)).read_text()
        except (FileNotFoundError, ValueError):
            return None
        return slot if holder == sandbox_id else None

    @contextlib.contextmanager
    def locked(
        self, kind: str, ident: str, blocking: bool = True, *, shared: bool = False
    ) -> Iterator[bool]:
        """Serialise operations on one id across threads and processes (flock on a striped
        file; each call opens its own descriptor, so threads exclude each other too).
        ``shared``: only against holders of the exclusive lock (a volume's users against
        its delete)."""
        # One file set per kind: a sandbox lock may be held while an image lock is taken
        # (snapshot), and two stripes of one file would deadlock on each other.
        stripe = zlib.crc32(ident.encode()) % LOCK_STRIPES
        with open(self.root / "locks" / f"{kind}-{stripe:03d}.lock", "w") as f:
            flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (
                0 if blocking else fcntl.LOCK_NB
            )
            try:
                fcntl.flock(f, flags)
            except BlockingIOError:
                yield False
                return
            yield True


class InitWatch:
    """Which sandboxes' inits live, asked of many at once: a pidfd per init, opened once
    (and checked against the init's start time right then, so it is that process and no
    other with a reused pid) and kept; one ``poll`` then tells every one that has exited
    (a pidfd becomes readable when its process ends). Inits beyond what the process may
    keep open are checked one by one (:func:`proc_starttime`)."""

    HEADROOM = 256  # descriptors left to everything else in the process

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: dict[str, tuple[int, int, int]] = {}  # sandbox id -> (pid, start, pidfd)
        # A runtime object dropped without close() (a test's, a bench's) frees them too.
        weakref.finalize(self, _close_pidfds, self._fds)

    def alive(self, inits: Mapping[str, tuple[int, int]]) -> set[str]:
        """The ids of ``inits`` (sandbox id -> (init pid, init start time)) that live."""
        with self._lock:
            for sid, (pid, start, fd) in list(self._fds.items()):
                if inits.get(sid) != (pid, start):  # gone, or a new init under that id
                    os.close(fd)
                    del self._fds[sid]
            room = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - self.HEADROOM
            one_by_one = []
            for sid, (pid, start) in inits.items():
                if sid in self._fds:
                    continue
                if len(self._fds) >= room:
                    one_by_one.append(sid)
                    continue
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue  # ended
                except OSError:
                    one_by_one.append(sid)  # out of descriptors after all
                    continue
                if proc_starttime(pid) != start:  # the pid is another process's now
                    os.close(fd)
                    continue
                self._fds[sid] = (pid, start, fd)
            poller = select.poll()
            for _, _, fd in self._fds.values():
                poller.register(fd, select.POLLIN)
            ended = {fd for fd, _ in poller.poll(0)}
            live = {sid for sid, (_, _, fd) in self._fds.items() if fd not in ended}
        live.update(sid for sid in one_by_one if proc_starttime(inits[sid][0]) == inits[sid][1])
        return live

    def close(self) -> None:
        with self._lock:
            _close_pidfds(self._fds)


def _close_pidfds(fds: dict[str, tuple[int, int, int]]) -> None:
    for _, _, fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
