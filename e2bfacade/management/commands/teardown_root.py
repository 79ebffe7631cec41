"""``python manage.py teardown_root [--kill]``: give up the local runtime root ``SANDBOX_ROOT``.

Removes what the root holds of the host — its network rules, routing tables and nftables
table, its claim in the host's registry of roots, its disks' mounts and loop devices, its
cgroups and launcher daemon (``e2bfacade/runtime/local/teardown.py``) — so another root may
take its range, and nothing of it keeps routing. Refuses while the root has live sandboxes,
naming them, unless ``--kill``: then running sandboxes are killed (their files go, as with
``DELETE``), and the disk of each paused one is kept under ``SANDBOX_ROOT/kept/<id>/``, never
deleted. Templates, snapshots and kept disks stay on disk, as does the directory. Stop the
root's service first. Safe to run again.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Remove the network rules, mounts, loop devices and cgroups of SANDBOX_ROOT."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--kill",
            action="store_true",
            help="kill the root's running sandboxes and end its paused ones (their disks are "
            "kept under SANDBOX_ROOT/kept/)",
        )

    def handle(self, *args: Any, kill: bool, **options: Any) -> None:
        if settings.SANDBOX_RUNTIME not in settings.LOCAL_FAMILY:
            raise CommandError(
                f"SANDBOX_RUNTIME={settings.SANDBOX_RUNTIME}: no local root to tear down"
            )
        from e2bfacade.runtime.base import RuntimeUnavailable
        from e2bfacade.runtime.local.teardown import LiveSandboxes, teardown_root

        root = settings.SANDBOX_ROOT
        try:
            report = teardown_root(root, kill=kill)
        except LiveSandboxes as exc:
            raise CommandError(
                f"{root}: {exc}; stop its service, then run again with --kill to kill the "
                "running ones and end the paused ones (their disks are kept)"
            ) from None
        except RuntimeUnavailable as exc:
            raise CommandError(f"{root}: {exc.message}") from None
        for sandbox_id in report.killed:
            self.stdout.write(f"killed sandbox {sandbox_id}")
        for path in report.kept:
            self.stdout.write(f"kept the disk of sandbox {path.parent.name}: {path}")
        if report.left:
            raise CommandError(f"{root}: could not remove: {'; '.join(report.left)}")
        self.stdout.write(
            f"{root} is torn down: no rule, table, mount, loop device or cgroup of it is left. "
            "Left on disk: its templates and snapshots (images/)"
            + (", the kept disks (kept/)" if report.kept else "")
            + " and the directory itself."
        )
