"""The native routes of shared keys (``/sharedkeys``, decision 0058): create
(PUT, as the AI Horde), read, change (PATCH) and delete one. Every answer
is the AI Horde's JSON."""

from __future__ import annotations

from hordelite.api import _render
from hordelite.api.native import keyed
from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request


class SharedKeyRoutes:
    def __init__(self, horde: Horde) -> None:
        self.horde = horde

    async def create(self, request: Request) -> Answer:
        body = await request.json(optional=True)
        made = await self.horde.shared_keys.create(request.api_key(), body)
        return json_answer(_render.shared_key(made))

    async def details(self, request: Request) -> Answer:
        found = await self.horde.shared_keys.details(request.params["key_id"])
        return json_answer(_render.shared_key(found))

    async def edit(self, request: Request) -> Answer:
        body = await request.json()
        return await keyed(request, "key_id", self.horde.shared_keys.edit, _render.shared_key, body)

    async def delete(self, request: Request) -> Answer:
        await self.horde.shared_keys.delete(request.api_key(), request.params["key_id"])
        return json_answer({"message": "OK"})
