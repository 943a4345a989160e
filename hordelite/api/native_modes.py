"""The native routes of the horde's modes (the AI Horde's ``HordeModes``):
GET /status/modes for everyone (raid mode shown to an admin's key only),
PUT /status/modes for admins. Every answer is the AI Horde's JSON."""

from __future__ import annotations

from hordelite.api import _render
from hordelite.horde.keys import hash_key
from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request


class ModeRoutes:
    def __init__(self, horde: Horde) -> None:
        self.horde = horde

    async def show(self, request: Request) -> Answer:
        # The key is optional here: sent, it must be an admin's.
        sent = request.header("apikey")
        key_hash = hash_key(request.api_key()) if sent else None
        modes, raid_shown = await self.horde.modes.show(key_hash)
        return json_answer(_render.modes(modes, raid_shown))

    async def set(self, request: Request) -> Answer:
        body = await request.json()
        changes, after = await self.horde.modes.set(
            hash_key(request.api_key()),
            body,
            request.client_address() or "",
            self.horde.clock.now(),
        )
        return json_answer(_render.modes_set(changes, after))
