"""hordelite's own admin routes under /api/v2/operations (the AI Horde has
none of them): ``GET /api/v2/operations/audit``, a page of the audit trail.

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
