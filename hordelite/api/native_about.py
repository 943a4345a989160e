"""The native routes of what the horde says of itself and of what hordelite
does not keep: /status/performance, /stats/text/*, /status/modes, /status/news,
/documents/*, and the AI Horde's teams and text styles (empty here,
decision 0055). Every answer is the AI Horde's JSON."""

from __future__ import annotations

from quart import Blueprint, Response, request

from hordelite._request import horde
from hordelite.api import _render
from hordelite.api.native import json_response
from hordelite.errors import RC, HordeError

about = Blueprint("about", __name__, url_prefix="/api/v2")


@about.get("/status/performance")
async def performance() -> Response:
    return json_response(_render.performance(await horde().about.performance()))


@about.get("/stats/text/totals")
async def text_totals() -> Response:
    stats = await horde().about.stats()
    return json_response(
        {period: {"requests": n, "tokens": t} for period, (n, t) in stats.totals.items()}
    )


@about.get("/stats/text/models")
async def text_models() -> Response:
    return json_response((await horde().about.stats()).models)


@about.get("/status/modes")
async def modes() -> Response:
    return json_response(_render.modes(horde().about.modes()))


@about.get("/status/news")
async def news() -> Response:
    return json_response([_render.news_piece(n) for n in horde().about.news()])


@about.get("/documents/terms")
async def terms() -> Response:
    return json_response(_render.document(horde().about.document("terms", _format())))


@about.get("/documents/privacy")
async def privacy() -> Response:
    return json_response(_render.document(horde().about.document("privacy", _format())))


@about.get("/documents/sponsors")
async def sponsors() -> Response:
    return json_response(_render.document(horde().about.document("sponsors", _format())))


def _format() -> str | None:
    return request.args.get("format")


@about.get("/teams")
async def teams() -> Response:
    # No teams (decision 0055): the AI Horde's answer for a horde without any.
    return json_response([])


@about.get("/teams/<team_id>")
async def team(team_id: str) -> Response:
    raise HordeError(RC.TeamNotFound, f"No team with id {team_id[:64]!r}.")


@about.get("/styles/text")
async def text_styles() -> Response:
    # No styles (decision 0055): a client applies its own.
    return json_response([])
