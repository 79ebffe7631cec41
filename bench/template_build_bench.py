"""Template builds through the real E2B Python SDK, against a real server.

    .venv/bin/python bench/template_build_bench.py [--runs 10] [--sqlite]

Starts its own gunicorn (4 sync workers), data plane and ``run_worker`` (one build thread)
on a fresh database (the PostgreSQL server of DATABASE_URL, or SQLite with --sqlite) and
SANDBOX_ROOT; needs root. Prints median and p99, side by side, of:

- a cached rebuild: ``Template.build`` of an unchanged template (every layer from the
  team's cache), end to end through the SDK (request, file check, trigger, status polls);
- a cold 3-step build: COPY + RUN + ENV on ``from_template("base")`` with ``skip_cache``
  (every step run in the build sandbox, the start command checked, layers captured);
- ``Sandbox.create`` from the built template and from ``base`` (and their ratio).

Each loop runs ``--runs`` times; builds are bounded by the SDK's own polling and the
server's step timeout.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2b import Sandbox, Template, wait_for_file  # noqa: E402
from e2b.template.main import TemplateFinal  # noqa: E402

from bench.stats import database_url, figure, percentile  # noqa: E402
from tests.support.live_server import live_server  # noqa: E402

NAME = "bench-tpl"
# A step's first log line (not its output): "[builder 2/3] RUN …", "CACHED [finalize] …".
STEP_HEADER = re.compile(
    r"^(CACHED )?(\[builder \d+/\d+\] (COPY|RUN|ENV) |\[finalize\] Finalizing)"
)


def template(context: Path) -> TemplateFinal:
    return (
        Template(file_context_path=str(context))
        .from_template("base")
        .copy("app/*", "app")
        .run_cmd("cat app/a.txt app/b.txt > app/all.txt && ls -l app")
        .set_envs({"BENCH": "1"})
        .set_start_cmd("touch /tmp/ready && sleep 600", wait_for_file("/tmp/ready"))
    )


def build(context: Path, *, cached: bool) -> float:
    """One ``Template.build`` end to end, in seconds; checks from its log that every step
    came from the layer cache (``cached``), or that none did. The template is made afresh
    each time: ``skip_cache`` sets ``force`` on the template object for good (the SDK's
    ``template._template._force = True``), so a reused one would never hit the cache."""
    logs: list[str] = []
    t = time.perf_counter()
    Template.build(
        template(context),
        NAME,
        skip_cache=not cached,
        cpu_count=1,
        memory_mb=1024,
        on_build_logs=lambda entry: logs.append(entry.message),
    )
    took = time.perf_counter() - t
    steps = [m for m in logs if STEP_HEADER.match(m)]
    hits = [m for m in steps if m.startswith("CACHED ")]
    assert len(steps) == 4 and len(hits) == (4 if cached else 0), logs
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="iterations of each (default 10)")
    parser.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    args = parser.parse_args()
    runs = max(1, min(args.runs, 1000))
    context = Path(tempfile.mkdtemp(prefix="e2bt-ctx-"))
    (context / "app").mkdir()
    (context / "app" / "a.txt").write_text("alpha\n" * 100)
    (context / "app" / "b.txt").write_text("beta\n" * 100)
    with live_server(database_url(args.sqlite)) as server:
        os.environ["E2B_API_URL"] = server.url
        os.environ["E2B_SANDBOX_URL"] = server.sandbox_url
        os.environ["E2B_API_KEY"] = server.api_key
        os.environ.pop("E2B_DEBUG", None)
        Sandbox.create(timeout=60).kill()  # warm-up: compiles sandboxd, builds base
        build(context, cached=False)  # the first build fills the layer cache
        times: dict[str, list[float]] = {
            "cached rebuild": [],
            "cold 3-step build": [],
            "create from built": [],
            "create from base": [],
        }
        for _ in range(runs):
            times["cold 3-step build"].append(build(context, cached=False))
        for _ in range(runs):
            times["cached rebuild"].append(build(context, cached=True))
        for _ in range(runs):
            for name, source in (("create from built", NAME), ("create from base", "base")):
                t = time.perf_counter()
                sandbox = Sandbox.create(source, timeout=120)
                times[name].append(time.perf_counter() - t)
                if source == NAME:  # the template is what was built
                    assert sandbox.files.read("/home/user/app/all.txt").startswith("alpha")
                sandbox.kill()
    backend = "SQLite" if args.sqlite else "PostgreSQL"
    print(f"Template builds, E2B Python SDK against e2bfacade ({backend}), {runs} runs each")
    print(f"{'operation':<20} {'p50 ms':>9} {'p99 ms':>9}")
    for name, values in times.items():
        p50 = statistics.median(values) * 1000
        p99 = percentile(values, 99) * 1000
        print(f"{name:<20} {p50:9.1f} {p99:9.1f}")
        figure(f"template_{name.replace(' ', '_').replace('-', '_')}_p50_ms", p50)
    ratio = statistics.median(times["create from built"]) / statistics.median(
        times["create from base"]
    )
    print(f"create from built / from base (p50): {ratio:.2f}x")
    figure("template_create_built_over_base_ratio", ratio)


if __name__ == "__main__":
    main()
