"""The native routes of timeouts and blocks by address, the AI Horde's
``/operations/ipaddr`` and ``/operations/block_worker_ipaddr`` (admins
only: 403 NotModerator for anyone else), with its bodies and answers, and
hordelite's ``"block": true`` for a block until lifted
(docs/reference/addresses.md)."""

from __future__ import annotations

from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request

_OK = {"message": "OK"}


class AddressRoutes:
    def __init__(self, horde: Horde) -> None:
        self.addresses = horde.addresses

    async def listed(self, request: Request) -> Answer:
        return json_answer(await self.addresses.listed(request.api_key()))

    async def one(self, request: Request) -> Answer:
        found = await self.addresses.covering(request.api_key(), request.params["ipaddr"])
        return json_answer(found)

    async def time_out(self, request: Request) -> Answer:
        body = await request.json()
        await self.addresses.time_out(request.api_key(), body, request.client_address())
        return json_answer(_OK)

    async def lift(self, request: Request) -> Answer:
        body = await request.json()
        await self.addresses.lift(request.api_key(), body, request.client_address())
        return json_answer(_OK)

    async def block_worker(self, request: Request) -> Answer:
        body = await request.json()
        worker_id = request.params["worker_id"]
        await self.addresses.block_worker(
            request.api_key(), worker_id, body, request.client_address()
        )
        return json_answer(_OK)

    async def unblock_worker(self, request: Request) -> Answer:
        worker_id = request.params["worker_id"]
        await self.addresses.unblock_worker(request.api_key(), worker_id, request.client_address())
        return json_answer(_OK)
