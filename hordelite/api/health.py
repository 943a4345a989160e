"""Health routes for process managers and load balancers.

``/healthz``: the process serves HTTP (liveness); it needs nothing else.
``/readyz``: it can take traffic: 503 with the reason while it is stopping
or its database does not answer. While its Redis signals are down it serves
degraded and stays ready, saying so (``"signals": "degraded"``), unless
``[signals] ready_when_degraded = false`` makes that 503 ``signals``
(decision 0054).
"""

from __future__ import annotations

from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request


class HealthRoutes:
    def __init__(self, horde: Horde) -> None:
        self.horde = horde

    async def healthz(self, request: Request) -> Answer:
        return json_answer({"status": "ok"})

    async def readyz(self, request: Request) -> Answer:
        upkeep = self.horde.upkeep
        reason = await upkeep.unready()
        if reason is not None:
            return json_answer({"status": "unready", "reason": reason}, 503)
        if upkeep.signals_degraded():
            return json_answer({"status": "ready", "signals": "degraded"})
        return json_answer({"status": "ready"})
