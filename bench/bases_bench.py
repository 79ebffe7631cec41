"""Template bases: seeding a loopback registry, and pulling and importing ``e2bdev/base``.

    .venv/bin/python bench/bases_bench.py [--cold] [--n 3]

Starts Debian's docker-registry on loopback (tests/support/registry.py), seeds it with the
Debian bases from the cache (``TEMPLATE_CACHE_DIR``/bases, default
/var/cache/e2bfacade/bases; ``--cold``: from an empty cache, which runs mmdebstrap and so
downloads from Debian's mirror), then, on a local runtime of its own (a scratch root under
/tmp), pulls ``e2bdev/base`` into an empty pull cache and imports it (cold), pulls it
again (the digest cached) and imports it as a second image, and runs a command in a
sandbox of it. Needs root. Prints seconds (medians of ``--n`` runs where repeated).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2bfacade.runtime.base import ProcessSpec, SandboxSpec  # noqa: E402
from e2bfacade.runtime.guest import run_process  # noqa: E402
from e2bfacade.runtime.local import LocalRuntime  # noqa: E402
from templates.builds import debian  # noqa: E402
from templates.builds.images import import_pulled  # noqa: E402
from templates.builds.registry import pull  # noqa: E402
from tests.runtime.conftest import destroy_runtime  # noqa: E402
from tests.support.registry import loopback_registry  # noqa: E402


def timed(what: str, seconds: float) -> None:
    print(f"{what:<58}{seconds:>8.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cold", action="store_true", help="seed from an empty cache")
    parser.add_argument("--n", type=int, default=3)
    args = parser.parse_args()
    cache = Path(os.environ.get("TEMPLATE_CACHE_DIR", "/var/cache/e2bfacade")) / "bases"
    scratch = Path(tempfile.mkdtemp(prefix="e2bb-bases-", dir="/tmp"))
    try:
        if args.cold:
            cache = scratch / "bases"
            with loopback_registry(scratch / "cold-registry") as url:
                started = time.monotonic()
                debian.seed(url, cache_dir=cache, log=lambda line: print("  " + line))
                timed("seed, cold (mmdebstrap, pack, push; both bases)", time.monotonic() - started)
        warm = []
        for i in range(args.n):
            with loopback_registry(scratch / f"registry-{i}") as url:
                started = time.monotonic()
                debian.seed(url, cache_dir=cache, offline=True, ubuntu_substitute=True)
                warm.append(time.monotonic() - started)
        timed(f"seed, warm (cache; 4 names, median of {args.n})", statistics.median(warm))
        with loopback_registry(scratch / "registry") as url:
            debian.seed(url, cache_dir=cache, offline=True)
            rt = LocalRuntime(scratch / "rt")
            try:
                pulls = scratch / "pulls"
                started = time.monotonic()
                pulled = pull("e2bdev/base", auth=None, mirror=url, cache_dir=pulls, team_id=1)
                timed("pull e2bdev/base, cold (inspect, copy, unpack)", time.monotonic() - started)
                started = time.monotonic()
                import_pulled(rt, "bench-base-1", pulled)
                timed("import_pulled e2bdev/base (a new image)", time.monotonic() - started)
                again = []
                for _ in range(args.n):
                    started = time.monotonic()
                    cached = pull("e2bdev/base", auth=None, mirror=url, cache_dir=pulls, team_id=1)
                    again.append(time.monotonic() - started)
                    assert cached.cached
                timed(f"pull e2bdev/base, cached (median of {args.n})", statistics.median(again))
                started = time.monotonic()
                import_pulled(rt, "bench-base-2", cached)
                timed("import_pulled again, a second image", time.monotonic() - started)
                sid = f"b{uuid.uuid4().hex[:12]}"
                started = time.monotonic()
                rt.create(SandboxSpec(sandbox_id=sid, image_id="bench-base-1", memory_mb=256))
                spec = ProcessSpec(("/bin/bash", "-lc", "id; python --version"), user="user")
                result = run_process(rt.guest(sid), spec)
                timed("create a sandbox of it + run a command as user", time.monotonic() - started)
                assert result.exit_code == 0, result
                rt.kill(sid)
            finally:
                destroy_runtime(rt)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
