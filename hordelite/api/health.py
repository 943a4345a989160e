"""Health routes for process managers and load balancers.

``/healthz``: the process serves HTTP (liveness); it needs nothing else.
``/readyz``: it can take traffic: 503 with the reason while it is stopping,
its database does not answer, or its Redis signals are down.
"""

from __future__ import annotations

from quart import Blueprint, Response

from hordelite._request import horde
from hordelite.api.native import json_response

health = Blueprint("health", __name__)


@health.get("/healthz")
async def healthz() -> Response:
    return json_response({"status": "ok"}, 200)


@health.get("/readyz")
async def readyz() -> Response:
    reason = await horde().upkeep.unready()
    if reason is not None:
        return json_response({"status": "unready", "reason": reason}, 503)
    return json_response({"status": "ready"}, 200)
