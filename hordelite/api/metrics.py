"""``GET /metrics``: the horde's Prometheus metrics (hordelite.horde.metrics).

On the horde's own port, or alone on a port of its own (``[metrics] port``);
not served at all with ``[metrics] enabled = false``. Every answer of the
app is counted here too, by route template, method and status.
"""

from __future__ import annotations

from quart import Blueprint, Quart, Response, request
from werkzeug.exceptions import HTTPException

from hordelite._request import horde
from hordelite.api.native import http_error_response
from hordelite.horde.metrics import UNMATCHED_ROUTE, scrape
from hordelite.horde.service import Horde
from hordelite.http.server import quart_app

metrics = Blueprint("metrics", __name__)

# The methods counted by name; any other (a client may send any token) is
# counted as "other", so that it cannot grow the label set.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# prometheus_client's CONTENT_TYPE_LATEST (text format 0.0.4).
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@metrics.get("/metrics")
async def metrics_text() -> Response:
    return Response(await scrape(horde()), content_type=_CONTENT_TYPE)


async def count_request(response: Response) -> Response:
    """After every answer: one increment, labelled by the route's template
    (an unmatched path by UNMATCHED_ROUTE), so that paths cannot grow the
    label set."""
    rule = request.url_rule
    method = request.method if request.method in _METHODS else "other"
    route = rule.rule if rule is not None else UNMATCHED_ROUTE
    horde().metrics.http_requests.labels(route, method, str(response.status_code)).inc()
    return response


def create_metrics_app(horde: Horde, backend: str = "trio") -> Quart:
    """The app of a port of its own: ``/metrics``, and a JSON 404 for the rest."""
    app = quart_app("hordelite-metrics", backend)
    app.config["HORDE"] = horde
    app.register_blueprint(metrics)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        return http_error_response(exc)

    return app
