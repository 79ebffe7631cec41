"""The sandboxes app's part of ``/metrics``: ``e2bfacade_sandboxes_by_state``.

Here rather than in ``e2bfacade/observability.py`` because it reads this app's table, and
e2bfacade sits below every app: ``SandboxesConfig.ready()`` registers it through
:func:`e2bfacade.observability.register_scrape_collector`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError
from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sandboxes.models import Sandbox

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
