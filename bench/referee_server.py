"""A live e2bfacade to point E2B's own SDK test suites at (the referee), on this machine only.

Starts the suite's test internet (tests/support/internet.py: a network namespace standing
for the internet, so sandboxes reach no real address), a fresh database and sandbox root,
a team, and ``manage.py serve`` with that namespace as the sandboxes' uplink; prints the
API key and the URLs, and serves until interrupted (then removes it all).

    python -m bench.referee_server [--postgres] [--port 3100] [--code-interpreter]
        [--registry [--ubuntu-substitute]]

With ``--code-interpreter`` the ``code-interpreter-v1`` template is built first. With
``--registry`` a registry on loopback (tests/support/registry.py) is seeded with this
service's Debian bases (``e2bdev/base``, ``debian:bookworm``; from the cache) and every
template build pulls from it (TEMPLATE_REGISTRY_MIRROR); ``--ubuntu-substitute`` also
serves the Debian image as ``ubuntu:22.04``, for the upstream tests that hard-code it
(their results are then a substitution's, to be reported apart).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from templates.builds import debian
from tests.support.internet import TestInternet
from tests.support.live_server import REPO, Deployment
from tests.support.registry import loopback_registry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL (default SQLite)")
    parser.add_argument("--port", type=int, default=3100)
    parser.add_argument("--code-interpreter", action="store_true")
    parser.add_argument("--registry", action="store_true", help="a seeded loopback mirror")
    parser.add_argument("--ubuntu-substitute", action="store_true")
    args = parser.parse_args()
    # SIGTERM as Ctrl-C: everything below is torn down either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.postgres:
        os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/e2bfacade")
    with contextlib.ExitStack() as stack:
        mirror = None
        if args.registry:
            storage = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="e2bref-reg-")))
            mirror = stack.enter_context(loopback_registry(storage))
            for seeded in debian.seed(mirror, ubuntu_substitute=args.ubuntu_substitute, log=print):
                print(f"registry: {seeded.name} ({seeded.seconds:.1f} s)", flush=True)
        return _serve(args, mirror)


def _serve(args: argparse.Namespace, mirror: str | None) -> int:
    with TestInternet() as internet:
        env = {
            "SANDBOX_UPLINK": internet.uplink,
            "SANDBOX_UPLINK_GATEWAY": internet.gateway,
            "SANDBOX_DNS_SERVERS": "8.8.8.8",
            "SANDBOX_EXTRA_CA_CERTS": str(internet.ca_path),
            "SANDBOX_MAX_TIMEOUT_SECONDS": "86400",
            **({"TEMPLATE_REGISTRY_MIRROR": mirror} if mirror else {}),
        }
        with Deployment(
            postgres=args.postgres, teams=0, team_names=["referee"], prefix="e2bref", extra_env=env
        ) as dep:
            if args.code_interpreter:
                dep.manage("build_code_interpreter", timeout=1800)
            serve = subprocess.Popen(
                [sys.executable, "manage.py", "serve", "--bind", f"127.0.0.1:{args.port}"],
                cwd=REPO,
                env=dep.env,
            )
            time.sleep(3)
            print(
                f"REFEREE api=http://127.0.0.1:{args.port} "
                f"sandbox=http://127.0.0.1:{args.port + 1} "
                f"key={dep.teams_by_name['referee'].api_key}",
                flush=True,
            )
            try:
                serve.wait()
            except KeyboardInterrupt:
                serve.send_signal(signal.SIGTERM)
                serve.wait(timeout=30)
            finally:
                dep.kill_all_sandboxes()
    return 0


if __name__ == "__main__":
    sys.exit(main())
