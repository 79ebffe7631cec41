"""/metrics under real gunicorn with several workers (gunicorn.conf.py's multiprocess
setup): whichever worker answers the scrape reports the requests of all of them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.live_server import ServerError, live_server, suite_database_url

REQUESTS = 60


def _ready_count(text: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "e2bfacade_http_requests_total" and s.labels.get("route") == "/health/ready"
    )


def test_every_worker_reports_the_sum_of_all_workers_requests() -> None:
    try:
        with (
            live_server(suite_database_url(), workers=3) as server,
            httpx.Client(base_url=server.url, timeout=30) as http,
        ):
            # Concurrent, so that the requests spread over the workers.
            with ThreadPoolExecutor(6) as pool:
                statuses = list(
                    pool.map(lambda _: http.get("/health/ready").status_code, range(REQUESTS))
                )
            assert statuses == [200] * REQUESTS

            scrapes = [http.get("/metrics") for _ in range(6)]
    except ServerError as exc:
        pytest.fail(str(exc), pytrace=False)

    for scrape in scrapes:
        assert scrape.status_code == 200
        assert _ready_count(scrape.text) == REQUESTS
        assert 'e2bfacade_sandboxes_by_state{state="running"}' in scrape.text
