"""The native routes of what the horde says of itself and of what hordelite
does not keep: /status/performance, /stats/text/*, /status/news,
/documents/*, and the AI Horde's teams and text styles (empty here,
decision 0055). Every answer is the AI Horde's JSON."""

from __future__ import annotations

from typing import Literal

from hordelite.api import _render
from hordelite.errors import RC, HordeError
from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request


class AboutRoutes:
    def __init__(self, horde: Horde) -> None:
        self.horde = horde

    async def performance(self, request: Request) -> Answer:
        return json_answer(_render.performance(await self.horde.about.performance()))

    async def text_totals(self, request: Request) -> Answer:
        stats = await self.horde.about.stats()
        return json_answer(
            {period: {"requests": n, "tokens": t} for period, (n, t) in stats.totals.items()}
        )

    async def text_models(self, request: Request) -> Answer:
        return json_answer((await self.horde.about.stats()).models)

    async def news(self, request: Request) -> Answer:
        return json_answer([_render.news_piece(n) for n in self.horde.about.news()])

    async def terms(self, request: Request) -> Answer:
        return self._document("terms", request)

    async def privacy(self, request: Request) -> Answer:
        return self._document("privacy", request)

    async def sponsors(self, request: Request) -> Answer:
        return self._document("sponsors", request)

    def _document(self, name: Literal["terms", "privacy", "sponsors"], request: Request) -> Answer:
        found = self.horde.about.document(name, request.arg("format"))
        return json_answer(_render.document(found))

    async def teams(self, request: Request) -> Answer:
        # No teams (decision 0055): the AI Horde's answer for a horde without any.
        return json_answer([])

    async def team(self, request: Request) -> Answer:
        team_id = request.params["team_id"]
        raise HordeError(RC.TeamNotFound, f"No team with id {team_id[:64]!r}.")

    async def text_styles(self, request: Request) -> Answer:
        # No styles (decision 0055): a client applies its own.
        return json_answer([])
