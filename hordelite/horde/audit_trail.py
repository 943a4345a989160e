"""The audit trail as the admins read it (``GET /api/v2/operations/audit``,
hordelite's own: the AI Horde keeps none), and as every reader shows an
entry (``entry_json``: that route and ``hordelite audit --json``).

Reading the trail is not itself recorded: it changes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

from hordelite.contract.audit_query import AuditQuery, AuditText, parse_query
from hordelite.horde._core import HordeCore
from hordelite.horde.keys import hash_key
from hordelite.storage import audit


@dataclasses.dataclass(frozen=True)
class AuditPage:
    """A page of entries, newest first, and the ``before`` of the next
    page (None: this is the last)."""

    entries: tuple[audit.AuditEntry, ...]
    next_before: int | None


class AuditTrail:
    def __init__(self, core: HordeCore) -> None:
        self._core = core

    async def page(self, api_key: str, query: Sequence[tuple[str, str]]) -> AuditPage:
        """The page the query's pairs ask for (``action`` repeated or a
        comma list, ``actor``, ``target``, ``since``, ``before``,
        ``limit``), for an admin; 403 NotModerator for anyone else, 400
        naming the parameter of a bad value."""
        asked = query_of(query, self._core.clock.now())
        found = await self._core.store.admin_audit(key_hash=hash_key(api_key), query=asked)
        full = len(found) == asked.limit
        return AuditPage(tuple(found), found[-1].id if full and found else None)


def query_of(pairs: Sequence[tuple[str, str]], now: float) -> AuditQuery:
    """The query of a route's parameters, each refused by its name."""
    one = {key: value for key, value in reversed(pairs)}  # the first of each
    given = AuditText(
        actions=[v for k, v in pairs if k == "action"],
        actor=one.get("actor"),
        target=one.get("target"),
        since=one.get("since"),
        before=one.get("before"),
        limit=one.get("limit"),
    )
    return parse_query(given, audit.ACTIONS, now)


def entry_json(entry: audit.AuditEntry) -> dict[str, Any]:
    """An entry as the admin route and ``hordelite audit --json`` show it:
    ``at`` in ISO 8601 (UTC) and as seconds since the epoch."""
    return {
        "id": entry.id,
        "at": datetime.datetime.fromtimestamp(entry.at, datetime.UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z"),
        "at_epoch": entry.at,
        "actor": entry.actor,
        "actor_id": entry.actor_id,
        "address": entry.address,
        "action": entry.action,
        "target": entry.target,
        "detail": dict(entry.detail),
    }
