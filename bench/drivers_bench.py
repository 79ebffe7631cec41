"""The local and gvisor sandbox drivers side by side: latency of each lifecycle step, pause
and resume of a sandbox holding 64 MiB, memory snapshots and forks, and idle memory.

    sudo .venv/bin/python bench/drivers_bench.py [--n 20] [--idle 5] [--forks 3] [--budget 60]
        [--mib 64] [--drivers local,gvisor]      # about 1.5 minutes with the defaults

Both drivers are measured in one run, at the runtime level (no server), each on a fresh
temporary SANDBOX_ROOT under /tmp (``e2bbl-*`` for local, ``e2bbg-*`` for gvisor):

- ``--n`` iterations of create (base image, 256 MB) → ``run_process(rt.guest(sid), "true")``
  (the guest resolved per call, as the data plane does per request) → pause → resume →
  snapshot (files only) → kill;
- ``--n`` pause/resume cycles of one sandbox whose python3 process holds 64 MiB of random
  bytes, with the size of gvisor's checkpoint on disk while paused, and a check after each
  resume that the process still runs;
- gvisor only: ``min(--n, 3)`` memory snapshots of a running sandbox with a small python3
  process, each followed by ``--forks`` sandboxes created from it (forks: they continue the
  source's processes, checked); local has no memory snapshots (files only);
- ``--idle`` idle sandboxes per driver, 3 rounds: the drop in the host's MemAvailable per
  sandbox and the sandboxes' cgroup memory usage (``rt.metrics(sid).mem_used``; on gvisor
  the group holds runsc's sentry and gofer). MemAvailable moves with everything else the
  host runs: with other work on it, trust the cgroup figure.

Each loop is bounded by its count and by ``--budget`` seconds. An operation that raises is
counted as failed (its traceback printed at the end) and the run goes on. It prints one
table, ``op | local p50 | local p99 | gvisor p50 | gvisor p99 | gvisor target`` (milliseconds,
nearest-rank p99), and FIGURE lines such as ``drivers.gvisor.pause_64mib_p50_ms``.
Everything it made is removed at the end, also on Ctrl-C or SIGTERM.

Targets (gvisor, set for the new driver; not yet in docs/performance.md): pause and resume
of a 64 MiB sandbox p50 ≤ 500 ms each, a fork (create from a memory snapshot) p50 ≤ 500 ms.
The local driver's own targets are bench/runtime_bench.py's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.runtime_bench import meminfo  # noqa: E402
from bench.stats import figure, percentile  # noqa: E402
from e2bfacade.runtime.base import ProcessSpec, RuntimeConflict, SandboxSpec  # noqa: E402
from e2bfacade.runtime.guest import run_process  # noqa: E402
from e2bfacade.runtime.local import HostRuntime, LocalRuntime, lxcfs  # noqa: E402
from e2bfacade.runtime.local.net.network import digest_of  # noqa: E402

MiB = 1024 * 1024
DRIVERS = ("local", "gvisor")
LIFECYCLE = ("create", "run_true", "pause", "resume", "snapshot", "kill")
TARGETS_MS = {"pause_64mib": 500.0, "resume_64mib": 500.0, "fork": 500.0}
HOLD = "import os,time; b=os.urandom({mib}<<20); time.sleep(1e6)"
SMALL = "import time; tag='e2bforkmark'; time.sleep(1e6)"
IDLE_ROUNDS = 3
ALLOCATE_WAIT_S = 1.0


@dataclass
class Result:
    """One driver's figures: samples (ms) and failures (tracebacks) per op, plus notes."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)  # single figures (bytes, counts)
    notes: list[str] = field(default_factory=list)

    def add(self, op: str, ms: float) -> None:
        self.samples.setdefault(op, []).append(ms)

    def fail(self, op: str, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.failures.setdefault(op, []).append(text)


class Failed(Exception):
    """An operation failed (already recorded): skip what depended on it."""


def timed(res: Result, op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn``, adding its duration to ``op``'s samples; on an exception, record it as a
    failure of ``op`` and raise :class:`Failed`."""
    start = time.perf_counter()
    try:
        out = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, the run goes on
        res.fail(op, exc)
        raise Failed(op) from exc
    res.add(op, (time.perf_counter() - start) * 1000)
    return out


def checked(res: Result, op: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run an untimed step; a failure is recorded under ``op`` and raises :class:`Failed`."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001
        res.fail(op, exc)
        raise Failed(op) from exc


def quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - best-effort tidying between measurements
        pass


def run(rt: HostRuntime, sid: str, *argv: str) -> Any:
    return run_process(rt.guest(sid), ProcessSpec(tuple(argv), timeout=30))


def run_true(rt: HostRuntime, sid: str) -> None:
    """``commands.run("true")`` as the data plane serves it: the guest resolved per request."""
    result = run_process(rt.guest(sid), ProcessSpec(("true",)))
    if result.exit_code != 0:
        raise RuntimeError(f"true in {sid}: exit {result.exit_code}")


def expect_ok(rt: HostRuntime, sid: str, *argv: str) -> None:
    result = run(rt, sid, *argv)
    if result.exit_code != 0:
        raise RuntimeError(
            f"{' '.join(argv)} in {sid}: exit {result.exit_code}, "
            f"stdout {result.stdout[-300:]!r}, stderr {result.stderr[-300:]!r}"
        )


def start_background(rt: HostRuntime, sid: str, code: str) -> None:
    """Start ``python3 -c code`` in the sandbox, unlimited in time, and let go of it."""
    rt.guest(sid).start_process(ProcessSpec(("python3", "-c", code), timeout=None)).close()


def tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


# ----------------------------------------------------------------------------- phases
def lifecycle(rt: HostRuntime, res: Result, n: int, budget: float) -> None:
    deadline = time.monotonic() + budget
    for i in range(n):
        if time.monotonic() > deadline:
            res.notes.append(f"lifecycle: stopped by the time budget after {i} of {n}")
            break
        sid, image = f"bl{i}", f"bl-snap{i}"
        try:
            timed(res, "create", rt.create, SandboxSpec(sid, "base", memory_mb=256))
            timed(res, "run_true", run_true, rt, sid)
            # A small change, so the snapshot archives something (not timed).
            checked(
                res, "snapshot", expect_ok, rt, sid, "sh", "-c", "echo state > /home/user/state"
            )
            timed(res, "pause", rt.pause, sid)
            timed(res, "resume", rt.resume, sid)
            timed(res, "snapshot", rt.snapshot, sid, image)
            timed(res, "kill", rt.kill, sid)
        except Failed:
            quietly(rt.kill, sid)
        quietly(rt.delete_image, image)


def hold_64mib(rt: HostRuntime, res: Result, n: int, budget: float, mib: int) -> None:
    """Pause/resume cycles of one sandbox holding ``mib`` MiB in a python3 process."""
    sid = "b64"
    try:
        checked(res, "pause_64mib", rt.create, SandboxSpec(sid, "base", memory_mb=256))
        checked(res, "pause_64mib", start_background, rt, sid, HOLD.format(mib=mib))
        time.sleep(ALLOCATE_WAIT_S)
        checked(res, "pause_64mib", expect_ok, rt, sid, "pgrep", "-f", "urandom")
        res.values["sandbox_mem_64mib"] = float(rt.metrics(sid).mem_used)
    except Failed:
        quietly(rt.kill, sid)
        return
    deadline = time.monotonic() + budget
    sizes, alive = [], 0
    for i in range(n):
        if time.monotonic() > deadline:
            res.notes.append(f"64 MiB pause/resume: stopped by the time budget after {i} of {n}")
            break
        try:
            timed(res, "pause_64mib", rt.pause, sid)
            checkpoint = rt.root / "sandboxes" / sid / "checkpoint"
            if checkpoint.is_dir():
                sizes.append(tree_bytes(checkpoint))
            timed(res, "resume_64mib", rt.resume, sid)
            checked(res, "alive_64mib", expect_ok, rt, sid, "pgrep", "-f", "urandom")
            alive += 1
        except Failed:
            break  # the sandbox's state is unknown now: stop this phase
    if sizes:
        res.values["checkpoint_64mib_bytes"] = float(statistics.median(sizes))
    res.values["alive_64mib"] = float(alive)
    quietly(rt.kill, sid)


def memory_snapshots(rt: HostRuntime, res: Result, rounds: int, forks: int, budget: float) -> None:
    """``rounds`` memory snapshots of a running sandbox, each with ``forks`` forks."""
    deadline = time.monotonic() + budget
    for r in range(rounds):
        if time.monotonic() > deadline:
            res.notes.append(f"memory snapshots: stopped by the time budget after {r} of {rounds}")
            break
        sid, image = f"bm{r}", f"bm-snap{r}"
        made: list[str] = []
        try:
            checked(res, "memory_snapshot", rt.create, SandboxSpec(sid, "base", memory_mb=256))
            checked(res, "memory_snapshot", start_background, rt, sid, SMALL)
            time.sleep(0.3)
            checked(res, "memory_snapshot", expect_ok, rt, sid, "pgrep", "-f", "e2bforkmark")
            timed(res, "memory_snapshot", rt.snapshot, sid, image, memory=True)
            checked(res, "memory_snapshot", expect_ok, rt, sid, "pgrep", "-f", "e2bforkmark")
            for f in range(forks):
                fork = f"bm{r}f{f}"
                made.append(fork)
                try:
                    timed(res, "fork", rt.create, SandboxSpec(fork, image))
                    checked(res, "fork_alive", expect_ok, rt, fork, "pgrep", "-f", "e2bforkmark")
                    res.values["forks_alive"] = res.values.get("forks_alive", 0.0) + 1
                except Failed:
                    pass
        except Failed:
            pass
        for s in (*made, sid):
            quietly(rt.kill, s)
        quietly(rt.delete_image, image)


def idle_memory(rt: HostRuntime, res: Result, count: int, budget: float) -> None:
    """Per round of ``count`` idle sandboxes: MemAvailable drop per sandbox, and the sum of
    their cgroups' memory usage (and per sandbox)."""
    deadline = time.monotonic() + budget
    avail, cgroup_sum, cgroup_each = [], [], []
    for r in range(IDLE_ROUNDS):
        if time.monotonic() > deadline:
            res.notes.append(f"idle: stopped by the time budget after {r} of {IDLE_ROUNDS} rounds")
            break
        ids = [f"bi{r}-{i}" for i in range(count)]
        made = []
        time.sleep(0.3)
        before = meminfo()["MemAvailable"]
        try:
            for sid in ids:
                checked(res, "idle", rt.create, SandboxSpec(sid, "base", memory_mb=256))
                made.append(sid)
            time.sleep(1.0)  # let the freshly started sandboxes settle
            after = meminfo()["MemAvailable"]
            used = [float(rt.metrics(sid).mem_used) for sid in ids]
            avail.append((before - after) / count)
            cgroup_sum.append(sum(used))
            cgroup_each += used
        except Failed:
            pass
        except Exception as exc:  # noqa: BLE001 - metrics
            res.fail("idle", exc)
        for sid in made:
            quietly(rt.kill, sid)
    if avail:
        res.values["idle_avail_per_sandbox"] = statistics.median(avail)
        res.values["idle_cgroup_sum"] = statistics.median(cgroup_sum)
        res.values["idle_cgroup_per_sandbox"] = statistics.median(cgroup_each)
        res.notes.append(
            "idle MemAvailable drop per sandbox by round: "
            + ", ".join(f"{v / MiB:.1f}" for v in avail)
            + " MB"
        )


# ---------------------------------------------------------------------------- drivers
def make_runtime(driver: str) -> HostRuntime:
    prefix = {"local": "e2bbl-", "gvisor": "e2bbg-"}[driver]
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        if driver == "local":
            return LocalRuntime(root)
        from e2bfacade.runtime.gvisor.driver import GvisorRuntime

        return GvisorRuntime(root)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def cleanup(rt: HostRuntime) -> None:
    """Kill every sandbox of ``rt``, its daemons and groups, and delete its root (as
    tests/runtime/conftest.py's destroy_runtime)."""
    quietly(rt.discard_spares)
    sandboxes = rt.root / "sandboxes"
    ids = (
        {p.name for p in sandboxes.iterdir() if not p.name.startswith(".")}
        if sandboxes.is_dir()
        else set()
    )
    try:
        ids |= rt.cgroups.list_ids()
    except OSError:
        pass
    for sid in ids:
        quietly(rt.kill, sid)
    # The helper daemon(s) this run started: any process whose command line names a
    # socket under this root.
    marker = str(rt.root / "run" / "sandboxd-").encode()
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    quietly(lxcfs.stop, rt.root)
    cg = rt.cgroups
    parents = list(cg.roots.values()) if cg.version == 1 else [cg.root]  # type: ignore[attr-defined]
    time.sleep(0.05)
    for parent in parents:
        try:
            parent.rmdir()
        except OSError:
            pass
    shutil.rmtree(rt.root, ignore_errors=True)


def leftovers(rt: HostRuntime, digest: str) -> list[str]:
    """What of ``rt`` is still on the host after :func:`cleanup`: its root, its groups,
    mounts under its root, processes naming its root or its digest (runsc's container ids
    carry it)."""
    left = [str(rt.root)] if rt.root.exists() else []
    cg = rt.cgroups
    parents = list(cg.roots.values()) if cg.version == 1 else [cg.root]  # type: ignore[attr-defined]
    left += [str(p) for p in parents if p.exists()]
    root = str(rt.root)
    left += [
        f"mount {line.split()[1]}"
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1].startswith(root)
    ]
    markers = [root.encode(), f"{digest}-".encode()]
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(m in cmd for m in markers):
            left.append(f"process {pid}: {cmd.replace(bytes(1), b' ')[:120]!r}")
    return left


def measure(driver: str, rt: HostRuntime, res: Result, args: argparse.Namespace) -> None:
    checked(res, "setup", rt.ensure_base_image)
    # Warm-up, not measured: compiles the helper, starts its daemon, warms caches.
    for i in range(2):
        sid = f"warm{i}"
        try:
            checked(res, "setup", rt.create, SandboxSpec(sid, "base", memory_mb=256))
            checked(res, "setup", expect_ok, rt, sid, "true")
        except Failed:
            pass
        quietly(rt.kill, sid)
    print(f"[{driver}] lifecycle x{args.n}", file=sys.stderr, flush=True)
    lifecycle(rt, res, args.n, args.budget)
    print(f"[{driver}] {args.mib} MiB pause/resume x{args.n}", file=sys.stderr, flush=True)
    hold_64mib(rt, res, args.n, args.budget, args.mib)
    if driver == "gvisor":
        rounds = min(args.n, 3)
        print(
            f"[{driver}] memory snapshots x{rounds}, forks x{args.forks} each",
            file=sys.stderr,
            flush=True,
        )
        memory_snapshots(rt, res, rounds, args.forks, args.budget)
    else:
        # Files only: a memory snapshot must be refused (checked once, not timed).
        sid = "bm-local"
        try:
            checked(res, "memory_snapshot", rt.create, SandboxSpec(sid, "base", memory_mb=256))
            try:
                rt.snapshot(sid, "bm-local-snap", memory=True)
                res.notes.append("snapshot(memory=True) did NOT raise RuntimeConflict")
                quietly(rt.delete_image, "bm-local-snap")
            except RuntimeConflict:
                pass
            except Exception as exc:  # noqa: BLE001
                res.fail("memory_snapshot", exc)
        except Failed:
            pass
        quietly(rt.kill, sid)
    print(f"[{driver}] idle x{args.idle}, {IDLE_ROUNDS} rounds", file=sys.stderr, flush=True)
    idle_memory(rt, res, args.idle, args.budget)


# ----------------------------------------------------------------------------- report
def cells(res: Result | None, op: str) -> tuple[str, str]:
    if res is None:
        return "-", "-"
    got = res.samples.get(op, [])
    bad = len(res.failures.get(op, []))
    if not got:
        return ("FAILED", "") if bad else ("n/a", "")
    p50, p99 = f"{statistics.median(got):.2f}", f"{percentile(got, 99):.2f}"
    return (p50 + (f" ({bad} FAILED)" if bad else ""), p99)


def first_line(text: str) -> str:
    """The last line of a traceback: the exception and its message."""
    return text.strip().splitlines()[-1]


def report(results: dict[str, Result], args: argparse.Namespace) -> None:
    rows = [
        ("create", "create"), ("run_true", "run_process true"), ("pause", "pause"),
        ("resume", "resume"), ("snapshot", "snapshot (files)"), ("kill", "kill"),
        ("pause_64mib", f"pause {args.mib} MiB"), ("resume_64mib", f"resume {args.mib} MiB"),
        ("memory_snapshot", "snapshot (memory)"), ("fork", "fork (create from it)"),
    ]  # fmt: skip
    counts = {d: {op: len(r.samples.get(op, [])) for op, _ in rows} for d, r in results.items()}
    print(
        f"drivers side by side: --n {args.n}, {os.cpu_count()} CPUs, kernel "
        f"{os.uname().release}; milliseconds, p99 nearest-rank"
    )
    head = ("op", "local p50", "local p99", "gvisor p50", "gvisor p99", "gvisor target")
    widths = (28, 18, 11, 12, 11, 16)
    print(
        "".join(
            f"{h:<{w}}" if i == 0 else f"{h:>{w}}"
            for i, (h, w) in enumerate(zip(head, widths, strict=True))
        )
    )
    for op, label in rows:
        lp50, lp99 = cells(results.get("local"), op)
        gp50, gp99 = cells(results.get("gvisor"), op)
        if op in ("memory_snapshot", "fork") and "local" in results:
            lp50, lp99 = "n/a (files only)", ""
        target = TARGETS_MS.get(op)
        mark = ""
        if target is not None:
            got = results.get("gvisor", Result()).samples.get(op)
            mark = f"≤ {target:g} " + (
                "ok" if got and statistics.median(got) <= target else "MISSED"
            )
        n_note = "/".join(str(counts[d][op]) for d in results)
        print(
            f"{label + (f' [{n_note}]' if n_note else ''):<28}{lp50:>18}{lp99:>11}{gp50:>12}"
            f"{gp99:>11}{mark:>16}"
        )
    print("  [a/b]: samples taken, local/gvisor")
    for driver, res in results.items():
        v = res.values
        bits = []
        if "sandbox_mem_64mib" in v:
            bits.append(
                f"cgroup usage of the {args.mib} MiB sandbox {v['sandbox_mem_64mib'] / MiB:.1f} MB"
            )
        if "checkpoint_64mib_bytes" in v:
            bits.append(
                f"checkpoint on disk while paused {v['checkpoint_64mib_bytes'] / MiB:.1f} MB"
            )
        if "alive_64mib" in v:
            bits.append(
                f"python still running after {int(v['alive_64mib'])}/"
                f"{len(res.samples.get('resume_64mib', []))} resumes"
            )
        if driver == "gvisor":
            bits.append(
                f"forks whose python runs {int(v.get('forks_alive', 0))}/"
                f"{len(res.samples.get('fork', []))}"
            )
        if "idle_avail_per_sandbox" in v:
            bits.append(
                f"idle x{args.idle}: MemAvailable drop "
                f"{v['idle_avail_per_sandbox'] / MiB:.1f} MB per sandbox, cgroup usage "
                f"{v['idle_cgroup_per_sandbox'] / MiB:.1f} MB per sandbox, "
                f"{v['idle_cgroup_sum'] / MiB:.1f} MB summed (medians of {IDLE_ROUNDS} rounds)"
            )
        print(f"{driver}: " + "; ".join(bits))
        for note in res.notes:
            print(f"  {driver} note: {note}")
    for driver, res in results.items():
        for op, texts in res.failures.items():
            print(f"FAILED {driver} {op} ({len(texts)}x): {first_line(texts[0])}")
            print("    " + texts[0].rstrip().replace("\n", "\n    "))
            others = {first_line(t) for t in texts[1:]} - {first_line(texts[0])}
            for other in sorted(others):
                print(f"    also: {other}")
    for driver, res in results.items():
        for op, got in res.samples.items():
            if got:
                figure(f"drivers.{driver}.{op}_p50_ms", statistics.median(got))
                figure(f"drivers.{driver}.{op}_p99_ms", percentile(got, 99))
        for name, scale in (
            ("checkpoint_64mib_bytes", ("checkpoint_64mib_mb", MiB)),
            ("idle_avail_per_sandbox", ("idle_memavailable_mb", MiB)),
            ("idle_cgroup_per_sandbox", ("idle_cgroup_mb", MiB)),
            ("idle_cgroup_sum", ("idle_cgroup_sum_mb", MiB)),
        ):
            if name in res.values:
                figure(f"drivers.{driver}.{scale[0]}", res.values[name] / scale[1])


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20, help="iterations per measurement (20)")
    parser.add_argument("--idle", type=int, default=5, help="idle sandboxes per round (5)")
    parser.add_argument("--forks", type=int, default=3, help="forks per memory snapshot (3)")
    parser.add_argument("--mib", type=int, default=64, help="MiB the paused sandbox holds (64)")
    parser.add_argument(
        "--budget", type=float, default=60.0, help="seconds each loop may take at most (60)"
    )
    parser.add_argument("--drivers", default=",".join(DRIVERS), help="local,gvisor")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (cgroups, mounts, runsc)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    drivers = [d for d in args.drivers.split(",") if d]
    results: dict[str, Result] = {}
    for driver in drivers:
        res = results[driver] = Result()
        rt = None
        try:
            rt = make_runtime(driver)
            print(f"[{driver}] root {rt.root}", file=sys.stderr, flush=True)
            measure(driver, rt, res, args)
        except Failed:
            pass  # recorded: the driver could not be set up
        except Exception as exc:  # noqa: BLE001 - the driver cannot run: report, go on
            res.fail("setup", exc)
        finally:
            if rt is not None:
                # A second Ctrl-C or SIGTERM must not cut the cleanup short.
                previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                try:
                    print(f"[{driver}] cleaning up {rt.root}", file=sys.stderr, flush=True)
                    cleanup(rt)
                    digest = digest_of(rt.root)[:8]
                    time.sleep(0.2)
                    for thing in leftovers(rt, digest):
                        res.notes.append(f"LEFT BEHIND after cleanup: {thing}")
                        print(f"[{driver}] LEFT BEHIND: {thing}", file=sys.stderr, flush=True)
                finally:
                    signal.signal(signal.SIGINT, previous)
                    signal.signal(signal.SIGTERM, interrupted)
    report(results, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
