"""cgroup v1 and v2 drivers: limits, freeze/thaw, kill and accounting for one sandbox.

Each sandbox gets one group named after its id under a parent group named after the
runtime's root (so a test runtime never touches a production one). The group, not a pid,
is a sandbox's identity on the host: it survives a restart of the service, a pid cannot be
reused into it, and killing it reaches every process a guest ever started.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from e2bfacade.runtime.base import RuntimeBusy, RuntimeUnavailable

CPU_PERIOD_US = 100_000
# Groups made ahead of a create, holding a parked launcher (spares.py); never a sandbox id.
SPARE_PREFIX = "spare-"


def _read(path: Path) -> str:
    return path.read_text().strip()


def _counter(path: Path, name: str) -> int:
    """The value of ``name`` in a flat keyed cgroup file (``name value`` lines); 0 when the
    file or the key is missing (an older kernel, groups already gone)."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _v1_mounts() -> dict[str, Path]:
    """Controller name -> mount point of every cgroup v1 hierarchy."""
    mounts: dict[str, Path] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields = post.split()
            if len(fields) < 3 or fields[0] != "cgroup":
                continue
            mount_point = Path(pre.split()[4])
            for opt in fields[2].split(","):
                mounts.setdefault(opt, mount_point)
    return mounts


def _v2_root() -> Path | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.split()[:1] == ["cgroup2"] and pre.split()[4] == "/sys/fs/cgroup":
                return Path("/sys/fs/cgroup")
    return None


def _subdirs(root: Path) -> set[str]:
    """The names of ``root``'s directories, from the directory's own entry types (no stat
    per entry: a sweep lists every hierarchy's groups on each tick)."""
    with os.scandir(root) as entries:
        return {e.name for e in entries if e.is_dir(follow_symlinks=False)}


class Cgroups:
    version: int

    def __init__(self, parent_name: str) -> None:
        self.parent_name = parent_name

    # Interface shared by both versions -------------------------------------------------
    def set_total(self, *, memory_bytes: int, pids_max: int) -> None:
        """Cap every sandbox of this runtime together (the parent group), so that no mix of
        guests can take the memory or pids the host itself needs."""
        raise NotImplementedError

    def create(self, sandbox_id: str, *, cpu_count: int, memory_mb: int, pids_max: int) -> None:
        raise NotImplementedError

    def make_group(self, name: str) -> None:
        """An empty group without limits of its own (a spare: see spares.py)."""
        raise NotImplementedError

    def adopt(self, spare: str, sandbox_id: str) -> bool:
        """Rename the spare group to the sandbox's id (limits are written by create()).
        False when that cannot be done (the spare was swept meanwhile)."""
        raise NotImplementedError

    def spare_groups(self, names: set[str] | None = None) -> list[str]:
        """The spare groups, of ``names`` (a listing from :meth:`names`) or listed now."""
        return sorted(
            n for n in (self._names() if names is None else names) if n.startswith(SPARE_PREFIX)
        )

    def list_ids(self, names: set[str] | None = None) -> set[str]:
        """Every sandbox's group (spare groups are not sandboxes), of ``names`` or listed
        now."""
        return {
            n for n in (self._names() if names is None else names) if not n.startswith(SPARE_PREFIX)
        }

    def names(self) -> set[str]:
        """Every group's name, in any hierarchy: one listing for a sweep to share (a
        hierarchy's listing costs about a microsecond per group)."""
        return self._names()

    def _names(self) -> set[str]:
        raise NotImplementedError

    def procs_files(self, sandbox_id: str) -> list[str]:
        raise NotImplementedError

    def root_procs_files(self) -> list[str]:
        """The hierarchies' root groups: always allowed to hold a process."""
        raise NotImplementedError

    def clone_into(self, sandbox_id: str) -> str | None:
        """The group a sandbox is created in with ``CLONE_INTO_CGROUP`` (cgroup v2), or None
        where that cannot be (v1: the creator joins ``procs_files`` and leaves again)."""
        return None

    def exists(self, sandbox_id: str) -> bool:
        raise NotImplementedError

    def pids(self, sandbox_id: str) -> list[int]:
        raise NotImplementedError

    def freeze(self, sandbox_id: str) -> None:
        raise NotImplementedError

    def thaw(self, sandbox_id: str) -> None:
        raise NotImplementedError

    def is_frozen(self, sandbox_id: str) -> bool:
        raise NotImplementedError

    def kill_all(self, sandbox_id: str) -> None:
        raise NotImplementedError

    def remove(self, sandbox_id: str) -> None:
        raise NotImplementedError

    def stats(self, sandbox_id: str) -> tuple[int, int, int, int]:
        """(cpu ns used, memory used bytes, page cache bytes, memory limit bytes)."""
        raise NotImplementedError

    def limit_events(self, sandbox_id: str) -> tuple[int, int]:
        """(processes the kernel killed for the memory limit, forks refused at the pids
        limit), counted since the groups were made."""
        raise NotImplementedError

    # Shared helpers -----------------------------------------------------------------------
    def wait_empty(self, sandbox_id: str, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.pids(sandbox_id):
                return True
            time.sleep(0.001)
        return not self.pids(sandbox_id)

    def _freeze_and_kill(self, sandbox_id: str) -> None:
        # Freeze first so no task can fork while we iterate, then kill, then thaw so the
        # frozen tasks can act on SIGKILL (a frozen task only dies once it runs again).
        self.freeze(sandbox_id)
        for pid in self.pids(sandbox_id):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.thaw(sandbox_id)

    @staticmethod
    def _rmdir(path: Path) -> None:
        # A group whose last task is exiting can refuse rmdir with EBUSY for a moment.
        for _ in range(200):
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)
        path.rmdir()

    @staticmethod
    def _pids_in(procs: Path) -> list[int]:
        try:
            return [int(x) for x in procs.read_text().split()]
        except FileNotFoundError:
            return []


class CgroupsV1(Cgroups):
    version = 1
    REQUIRED = ("freezer", "memory", "pids")
    OPTIONAL = ("cpu", "cpuacct")

    def __init__(self, parent_name: str, mounts: dict[str, Path]) -> None:
        super().__init__(parent_name)
        self.roots = {
            c: mounts[c] / parent_name for c in self.REQUIRED + self.OPTIONAL if c in mounts
        }
        for root in self.roots.values():
            root.mkdir(exist_ok=True)

    def _dirs(self, sandbox_id: str) -> dict[str, Path]:
        return {c: root / sandbox_id for c, root in self.roots.items()}

    def set_total(self, *, memory_bytes: int, pids_max: int) -> None:
        _write(self.roots["memory"] / "memory.limit_in_bytes", str(memory_bytes))
        _write(self.roots["pids"] / "pids.max", str(pids_max))

    def create(self, sandbox_id: str, *, cpu_count: int, memory_mb: int, pids_max: int) -> None:
        dirs = self._dirs(sandbox_id)
        for d in dirs.values():
            d.mkdir(exist_ok=True)
        limit = str(memory_mb * 1024 * 1024)
        _write(dirs["memory"] / "memory.limit_in_bytes", limit)
        memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # without swap accounting the memory limit alone binds
            _write(memsw, limit)
        _write(dirs["pids"] / "pids.max", str(pids_max))
        if "cpu" in dirs:
            _write(dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(dirs["cpu"] / "cpu.cfs_quota_us", str(cpu_count * CPU_PERIOD_US))

    def make_group(self, name: str) -> None:
        for d in self._dirs(name).values():
            d.mkdir(exist_ok=True)

    def adopt(self, spare: str, sandbox_id: str) -> bool:
        # cpu and cpuacct may be one hierarchy: rename each directory once.
        pairs = {str(d): (d, self._dirs(sandbox_id)[c]) for c, d in self._dirs(spare).items()}
        try:
            for src, dst in pairs.values():
                os.rename(src, dst)
        except OSError:
            return False
        return True

    def procs_files(self, sandbox_id: str) -> list[str]:
        return [str(d / "cgroup.procs") for d in self._dirs(sandbox_id).values()]

    def root_procs_files(self) -> list[str]:
        return [str(root.parent / "cgroup.procs") for root in self.roots.values()]

    def exists(self, sandbox_id: str) -> bool:
        return (self.roots["freezer"] / sandbox_id).is_dir()

    def pids(self, sandbox_id: str) -> list[int]:
        return self._pids_in(self.roots["freezer"] / sandbox_id / "cgroup.procs")

    def _freezer_state(self, sandbox_id: str) -> Path:
        return self.roots["freezer"] / sandbox_id / "freezer.state"

    def freeze(self, sandbox_id: str) -> None:
        state = self._freezer_state(sandbox_id)
        _write(state, "FROZEN")
        # FREEZING means some task has not stopped yet; the kernel retries when written again.
        for _ in range(2000):
            if _read(state) == "FROZEN":
                return
            _write(state, "FROZEN")
            time.sleep(0.0005)
        raise RuntimeBusy(f"sandbox {sandbox_id} did not freeze within 1 s")

    def thaw(self, sandbox_id: str) -> None:
        _write(self._freezer_state(sandbox_id), "THAWED")

    def is_frozen(self, sandbox_id: str) -> bool:
        try:
            return _read(self._freezer_state(sandbox_id)) != "THAWED"
        except FileNotFoundError:
            return False

    def kill_all(self, sandbox_id: str) -> None:
        if self.exists(sandbox_id):
            self._freeze_and_kill(sandbox_id)

    def remove(self, sandbox_id: str) -> None:
        for d in self._dirs(sandbox_id).values():
            self._rmdir(d)

    def _names(self) -> set[str]:
        ids: set[str] = set()
        for root in self.roots.values():
            ids |= _subdirs(root)
        return ids

    def stats(self, sandbox_id: str) -> tuple[int, int, int, int]:
        dirs = self._dirs(sandbox_id)
        cpu_ns = int(_read(dirs["cpuacct"] / "cpuacct.usage")) if "cpuacct" in dirs else 0
        mem_used = int(_read(dirs["memory"] / "memory.usage_in_bytes"))
        limit = int(_read(dirs["memory"] / "memory.limit_in_bytes"))
        cache = 0
        for line in (dirs["memory"] / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "cache":
                cache = int(value)
        return cpu_ns, mem_used, cache, limit

    def limit_events(self, sandbox_id: str) -> tuple[int, int]:
        dirs = self._dirs(sandbox_id)
        oom = _counter(dirs["memory"] / "memory.oom_control", "oom_kill")
        return oom, _counter(dirs["pids"] / "pids.events", "max")


class CgroupsV2(Cgroups):
    version = 2
    CONTROLLERS = ("memory", "pids", "cpu")

    def __init__(self, parent_name: str, root: Path) -> None:
        super().__init__(parent_name)
        self.root = root / parent_name
        self.root.mkdir(exist_ok=True)
        available = set(_read(root / "cgroup.controllers").split())
        missing = {"memory", "pids"} - available
        if missing:
            raise RuntimeUnavailable(
                f"cgroup v2 lacks the {', '.join(sorted(missing))} controller(s)"
            )
        wanted = " ".join(f"+{c}" for c in self.CONTROLLERS if c in available)
        _write(root / "cgroup.subtree_control", wanted)
        _write(self.root / "cgroup.subtree_control", wanted)

    def _dir(self, sandbox_id: str) -> Path:
        return self.root / sandbox_id

    def set_total(self, *, memory_bytes: int, pids_max: int) -> None:
        _write(self.root / "memory.max", str(memory_bytes))
        _write(self.root / "pids.max", str(pids_max))

    def create(self, sandbox_id: str, *, cpu_count: int, memory_mb: int, pids_max: int) -> None:
        d = self._dir(sandbox_id)
        d.mkdir(exist_ok=True)
        _write(d / "memory.max", str(memory_mb * 1024 * 1024))
        if (d / "memory.swap.max").exists():
            _write(d / "memory.swap.max", "0")
        _write(d / "pids.max", str(pids_max))
        if (d / "cpu.max").exists():
            _write(d / "cpu.max", f"{cpu_count * CPU_PERIOD_US} {CPU_PERIOD_US}")

    def make_group(self, name: str) -> None:
        self._dir(name).mkdir(exist_ok=True)

    def adopt(self, spare: str, sandbox_id: str) -> bool:
        return False  # cgroup v2 cannot rename a group (spares are not used on v2)

    def procs_files(self, sandbox_id: str) -> list[str]:
        return [str(self._dir(sandbox_id) / "cgroup.procs")]

    def clone_into(self, sandbox_id: str) -> str | None:
        return str(self._dir(sandbox_id))

    def root_procs_files(self) -> list[str]:
        return [str(self.root.parent / "cgroup.procs")]

    def exists(self, sandbox_id: str) -> bool:
        return self._dir(sandbox_id).is_dir()

    def pids(self, sandbox_id: str) -> list[int]:
        return self._pids_in(self._dir(sandbox_id) / "cgroup.procs")

    def _frozen_event(self, sandbox_id: str) -> bool:
        for line in (self._dir(sandbox_id) / "cgroup.events").read_text().splitlines():
            if line.startswith("frozen "):
                return line.split()[1] == "1"
        return False

    def freeze(self, sandbox_id: str) -> None:
        _write(self._dir(sandbox_id) / "cgroup.freeze", "1")
        for _ in range(2000):
            if self._frozen_event(sandbox_id):
                return
            time.sleep(0.0005)
        raise RuntimeBusy(f"sandbox {sandbox_id} did not freeze within 1 s")

    def thaw(self, sandbox_id: str) -> None:
        _write(self._dir(sandbox_id) / "cgroup.freeze", "0")

    def is_frozen(self, sandbox_id: str) -> bool:
        try:
            return _read(self._dir(sandbox_id) / "cgroup.freeze") == "1"
        except FileNotFoundError:
            return False

    def kill_all(self, sandbox_id: str) -> None:
        d = self._dir(sandbox_id)
        if not d.is_dir():
            return
        if (d / "cgroup.kill").exists():  # Linux 5.14+: atomic, frozen tasks included
            _write(d / "cgroup.kill", "1")
            return
        self._freeze_and_kill(sandbox_id)

    def remove(self, sandbox_id: str) -> None:
        self._rmdir(self._dir(sandbox_id))

    def _names(self) -> set[str]:
        return _subdirs(self.root)

    def stats(self, sandbox_id: str) -> tuple[int, int, int, int]:
        d = self._dir(sandbox_id)
        cpu_ns = 0
        for line in (d / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                cpu_ns = int(line.split()[1]) * 1000
        mem_used = int(_read(d / "memory.current"))
        raw_limit = _read(d / "memory.max")
        limit = int(raw_limit) if raw_limit != "max" else 0
        cache = 0
        for line in (d / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "file":
                cache = int(value)
        return cpu_ns, mem_used, cache, limit

    def limit_events(self, sandbox_id: str) -> tuple[int, int]:
        d = self._dir(sandbox_id)
        return _counter(d / "memory.events", "oom_kill"), _counter(d / "pids.events", "max")


def detect(parent_name: str, prefer: str = "auto") -> Cgroups:
    """The cgroup driver for this host. ``prefer`` is "auto", "v1" or "v2"."""
    if prefer not in {"auto", "v1", "v2"}:
        raise RuntimeUnavailable(f"unknown cgroup version {prefer!r}: use auto, v1 or v2")
    v2 = _v2_root()
    if prefer in {"auto", "v2"} and v2 is not None:
        return CgroupsV2(parent_name, v2)
    mounts = _v1_mounts()
    missing = [c for c in CgroupsV1.REQUIRED if c not in mounts]
    if prefer == "v2" or missing:
        raise RuntimeUnavailable(
            "no usable cgroups: the local runtime needs cgroup v2 with the memory and pids "
            f"controllers, or cgroup v1 with {', '.join(CgroupsV1.REQUIRED)} "
            f"(missing here: {', '.join(missing) or 'cgroup v2'})"
        )
    return CgroupsV1(parent_name, mounts)
