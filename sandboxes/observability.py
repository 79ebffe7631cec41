"""The sandboxes app's part of ``/metrics``: ``e2bfacade_sandboxes_by_state``,
``e2bfacade_volumes_by_state`` and ``e2bfacade_volumes_allocated_mb``.

Here rather than in ``e2bfacade/observability.py`` because it reads this app's table, and
e2bfacade sits below every app: ``SandboxesConfig.ready()`` registers it through
:func:`e2bfacade.observability.register_scrape_collector`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError
from django.db.models import Count, Sum
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sandboxes.models import Sandbox, Volume

logger = logging.getLogger(__name__)


class SandboxStateCollector(Collector):
    """``e2bfacade_sandboxes_by_state``, computed when scraped: one GROUP BY on the
    sandbox table. Every state is reported, zeros included, so a series never vanishes."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            counts = dict(
                Sandbox.objects.order_by()
                .values_list("state")
                .annotate(n=Count("*"))
                .values_list("state", "n")
            )
        except DatabaseError:
            # A scrape must not fail because the database is down: the readiness check and
            # the request metrics say that. The gauge is simply absent from this scrape.
            logger.warning("metrics: cannot count sandboxes by state", exc_info=True)
            return
        family = GaugeMetricFamily(
            "e2bfacade_sandboxes_by_state",
            "Sandboxes in the database by internal state (killed ones included).",
            labels=["state"],
        )
        for state in Sandbox.State:
            family.add_metric([state.value], counts.get(state.value, 0))
        yield family


SANDBOX_STATES = SandboxStateCollector()


class VolumeStateCollector(Collector):
    """``e2bfacade_volumes_by_state`` and ``e2bfacade_volumes_allocated_mb`` (the size limits
    the volumes allocate on their hosts' disks), computed when scraped: one GROUP BY on the
    volume table. By state only, as the sandboxes' gauge: a series per team would grow with
    the teams (the admin's volume list filters by team)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            rows = {
                state: (n, mb or 0)
                for state, n, mb in Volume.objects.order_by()
                .values_list("state")
                .annotate(n=Count("*"), mb=Sum("size_mb"))
                .values_list("state", "n", "mb")
            }
        except DatabaseError:
            logger.warning("metrics: cannot count volumes by state", exc_info=True)
            return
        count = GaugeMetricFamily(
            "e2bfacade_volumes_by_state",
            "Volumes in the database by state (creating and deleting ones are in flight).",
            labels=["state"],
        )
        allocated = GaugeMetricFamily(
            "e2bfacade_volumes_allocated_mb",
            "The size limits of the volumes in the database, summed by state (MB).",
            labels=["state"],
        )
        for state in Volume.State:
            n, mb = rows.get(state.value, (0, 0))
            count.add_metric([state.value], n)
            allocated.add_metric([state.value], mb)
        yield count
        yield allocated


VOLUME_STATES = VolumeStateCollector()
