"""``GET /metrics``: the horde's Prometheus metrics (hordelite.horde.metrics).
On the horde's own port, or alone on a port of its own (``[metrics] port``);
not served at all with ``[metrics] enabled = false``. Every answer of the
horde's port is counted too, by route template, method and status.
"""

from __future__ import annotations

from hordelite.errors import RC
from hordelite.horde.metrics import UNMATCHED_ROUTE, scrape
from hordelite.horde.service import Horde
from hordelite.http.answer import Answer
from hordelite.http.dispatch import COUNTED_METHODS
from hordelite.http.request import Request

# prometheus_client's CONTENT_TYPE_LATEST (text format 0.0.4).
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsRoutes:
    def __init__(self, horde: Horde) -> None:
        self.horde = horde

    async def metrics(self, request: Request) -> Answer:
        return Answer(200, [("content-type", _CONTENT_TYPE)], await scrape(self.horde))

    def count_answer(self, route: str | None, method: str, status: int) -> None:
        """One increment an answer, labelled by the route's template (an
        unmatched path by UNMATCHED_ROUTE) and the method (any but the
        usual ones as "other"), so that clients cannot grow the label set."""
        method = method if method in COUNTED_METHODS else "other"
        self.horde.metrics.http_requests.labels(
            route or UNMATCHED_ROUTE, method, str(status)
        ).inc()

    def count_refusal(self, rc: RC) -> None:
        """A refusal answered, by its return code (a closed set)."""
        self.horde.metrics.refusals.labels(rc.name).inc()
