"""Health routes for process managers and load balancers.

``/healthz``: the process serves HTTP (liveness); it needs nothing else.
``/readyz``: it can take traffic: 503 with the reason while it is stopping
or its database does not answer. While its Redis signals are down it serves
degraded and stays ready, saying so (``"signals": "degraded"``), unless
``[signals] ready_when_degraded = false`` makes that 503 ``signals``
(decision 0054).
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
    upkeep = horde().upkeep
    reason = await upkeep.unready()
    if reason is not None:
        return json_response({"status": "unready", "reason": reason}, 503)
    if upkeep.signals_degraded():
        return json_response({"status": "ready", "signals": "degraded"}, 200)
    return json_response({"status": "ready"}, 200)
