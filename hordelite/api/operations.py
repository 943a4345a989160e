"""Admin routes under /api/v2/operations: hordelite's own ``GET
/api/v2/operations/audit``, a page of the audit trail, and the AI Horde's
moderation review (``/operations/moderation``: the overview of paused
workers, the prompt events and their notes, the worker suspicion events;
hordelite.horde.moderation_review).

Admins only: anyone else is refused with the AI Horde's 403 NotModerator.
"""

from __future__ import annotations

from urllib.parse import urlencode

from hordelite.horde.audit_trail import entry_json
from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request


class OperationsRoutes:
    def __init__(self, horde: Horde) -> None:
        self.horde = horde

    async def audit(self, request: Request) -> Answer:
        """A JSON list of entries, newest first. When more follow, the next
        page's cursor is ``X-Next-Before`` (the ``before`` to send) and its
        URL the ``Link: <...>; rel="next"`` header, as the listings page."""
        page = await self.horde.audit.page(request.api_key(), request.query())
        headers: list[tuple[str, str]] = []
        if page.next_before is not None:
            query = [(k, v) for k, v in request.query() if k != "before"]
            query.append(("before", str(page.next_before)))
            headers.append(("X-Next-Before", str(page.next_before)))
            headers.append(("Link", f'<{request.path}?{urlencode(query)}>; rel="next"'))
        body = [entry_json(e) for e in page.entries]
        return json_answer(body, headers=headers, ensure_ascii=False)

    async def moderation(self, request: Request) -> Answer:
        return json_answer(await self.horde.review.overview(request.api_key(), request.query()))

    async def prompt_events(self, request: Request) -> Answer:
        found = await self.horde.review.prompt_events(request.api_key(), request.query())
        return json_answer(found, ensure_ascii=False)

    async def prompt_note(self, request: Request) -> Answer:
        body = await request.json()
        made = await self.horde.review.add_note(
            request.api_key(), request.params["event_id"], body, request.client_address() or ""
        )
        return json_answer(made, 201, ensure_ascii=False)

    async def suspicion_events(self, request: Request) -> Answer:
        found = await self.horde.review.suspicion_events(request.api_key(), request.query())
        return json_answer(found, ensure_ascii=False)
