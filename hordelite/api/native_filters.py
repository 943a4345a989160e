"""The native routes of prompt filters (``/filters``, docs/reference/filters.md),
the AI Horde's, for admins: list, add (PUT), test a prompt (POST), each
type's combined regex, read, change (PATCH) and delete one. Every answer is
the AI Horde's JSON, a filter's with hordelite's ``action`` beside its fields."""

from __future__ import annotations

from typing import Any

from hordelite.horde.moderation import FilterRecord
from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request


class FilterRoutes:
    def __init__(self, horde: Horde) -> None:
        self.horde = horde

    async def listing(self, request: Request) -> Answer:
        found = await self.horde.moderation.listing(
            request.api_key(), request.arg("filter_type"), request.arg("contains")
        )
        return json_answer([details(f) for f in found])

    async def create(self, request: Request) -> Answer:
        body = await request.json()
        made, new = await self.horde.moderation.create(
            request.api_key(), body, request.client_address() or ""
        )
        # The same regex and type again answers the filter there is (200).
        return json_answer(details(made), 201 if new else 200)

    async def test(self, request: Request) -> Answer:
        body = await request.json()
        suspicion, matches = await self.horde.moderation.test(request.api_key(), body)
        return json_answer({"suspicion": suspicion, "matches": matches})

    async def regex(self, request: Request) -> Answer:
        found = await self.horde.moderation.regexes(request.api_key(), request.arg("filter_type"))
        return json_answer([{"filter_type": t, "regex": r} for t, r in found])

    async def one(self, request: Request) -> Answer:
        found = await self.horde.moderation.one(request.api_key(), request.params["filter_id"])
        return json_answer(details(found))

    async def edit(self, request: Request) -> Answer:
        body = await request.json()
        changed = await self.horde.moderation.edit(
            request.api_key(), request.params["filter_id"], body, request.client_address() or ""
        )
        return json_answer(details(changed))

    async def delete(self, request: Request) -> Answer:
        await self.horde.moderation.delete(
            request.api_key(), request.params["filter_id"], request.client_address() or ""
        )
        return json_answer({"message": "OK"})


def details(f: FilterRecord) -> dict[str, Any]:
    """The AI Horde's FilterDetails (its id a string), and the action."""
    return {
        "id": str(f.id),
        "regex": f.regex,
        "filter_type": f.filter_type,
        "description": f.description,
        "replacement": f.replacement,
        "user": f.user,
        "action": f.action,
    }
