"""Health routes for process managers and load balancers.

``/healthz``: the process serves HTTP (liveness); it needs nothing else.
``/readyz``: it can take traffic: 503 with the reason while it is stopping,
its database does not answer, or its Redis signals are down.
"""

from __future__ import annotations

import json

from quart import Blueprint, Response

from hordelite._request import horde

health = Blueprint("health", __name__)


def _answer(body: dict[str, str], status: int) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")


@health.get("/healthz")
async def healthz() -> Response:
    return _answer({"status": "ok"}, 200)


@health.get("/readyz")
async def readyz() -> Response:
    reason = await horde().unready()
    if reason is not None:
        return _answer({"status": "unready", "reason": reason}, 503)
    return _answer({"status": "ready"}, 200)
