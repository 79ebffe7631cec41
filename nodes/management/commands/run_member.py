"""``python manage.py run_member``: this host's membership of the fleet
(``e2bfacade/fleet/membership.py``): it registers the host in etcd under a lease, renews it
every third of ``FLEET_LEASE_SECONDS`` while etcd and the database answer, and moves the
fence every process of the host reads before it serves sandbox work. ``manage.py serve``
starts it when ``ETCD_ENDPOINTS`` is set. SIGTERM stops it and keeps the lease: a restart
within the lease keeps the host's incarnation."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connection

from e2bfacade.fleet import membership
from e2bfacade.fleet.host import state_dir
from nodes.fleet import advert, this_label


def database_check() -> None:
    # A connection the database dropped (a restart, a partition) is replaced, and the
    # query proves this host reaches the database now.
    close_old_connections()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


class Command(BaseCommand):
    help = "Keep this host a member of the fleet in etcd (needs ETCD_ENDPOINTS)."

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.ETCD_ENDPOINTS:
            raise CommandError("ETCD_ENDPOINTS is not set: this host is a fleet of one")
        # A call to a member that does not answer gives up after an eighth of the lease: a beat
        # that tries it and then another still ends well within half a lease.
        timeout = max(settings.FLEET_LEASE_SECONDS / 8, 0.5)
        member = membership.Member(
            membership.clients(settings.ETCD_ENDPOINTS, timeout),
            prefix=settings.FLEET_PREFIX,
            label=this_label(),
            advert=advert,
            ttl=settings.FLEET_LEASE_SECONDS,
            state_dir=state_dir(),
            database_check=database_check,
        )
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        member.run(stop)
