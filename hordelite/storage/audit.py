"""The audit trail (decision 0077): what moderators did and what filters
refused or flagged, each entry written in the transaction of the change it
records, so that an action and its entry stand or fall together.

Actors: ``name#id`` for a user acting through the routes, ``cli`` for the
operator at the shell, ``horde`` for the horde's own countermeasures (a
timeout grown by repeated offences, a worker paused by its suspicion).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, Select, delete, insert, select

from hordelite.contract.audit_query import AuditQuery, Paging
from hordelite.contract.limits import AUDIT_PAGE
from hordelite.storage.schema import audit
from hordelite.storage.transaction import Tx

# A read of the whole trail, newest first (the first page).
EVERY = AuditQuery()

# The actors that are not a user.
CLI = "cli"
HORDE = "horde"

# Every action the trail records, by name: one place, for the CLI's filter
# and the docs (docs/reference/audit.md).
ACTIONS = (
    "filter.create",
    "filter.edit",
    "filter.delete",
    "request.refused",
    "request.flagged",
    "prompt.note",
    "address.timeout",
    "address.block",
    "address.lift",
    "worker.pause",
    "worker.resume",
    "worker.maintenance",
    "worker.edit",
    "worker.delete",
    "worker.suspicion",
    "worker.suspicion_reset",
    "worker.address_block",
    "mode.set",
    "kudos.grant",
    "key.revoke",
    "key.rotate",
    "user.edit",
    "user.create",
    "message.send",
    "message.delete",
)


@dataclasses.dataclass(frozen=True)
class Actor:
    """Who acts: ``name`` as recorded, the user's id when it is one, and
    the address the action came from ("" at the shell)."""

    name: str
    user_id: int | None = None
    address: str = ""


CLI_ACTOR = Actor(CLI)
HORDE_ACTOR = Actor(HORDE)


def user_actor(user: Mapping[str, Any], address: str | None) -> Actor:
    """The actor of a user's row (authenticated in the transaction that
    records it) acting from ``address`` (None: not known)."""
    return Actor(handle(user), user["id"], address or "")


def handle(user: Mapping[str, Any]) -> str:
    """``name#id`` of a user's row: how the trail names a user, as actor or
    target (the name it had when the entry was written)."""
    return f"{user['username']}#{user['id']}"


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    id: int
    at: float
    actor: str
    actor_id: int | None
    address: str
    action: str
    target: str
    detail: Mapping[str, Any]


def record(
    conn: Tx,
    actor: Actor,
    action: str,
    target: str,
    now: float,
    detail: Mapping[str, Any] | None = None,
) -> None:
    """One entry, in the caller's transaction."""
    if action not in ACTIONS:
        raise ValueError(f"not an audit action: {action!r}")
    conn.execute(
        insert(audit).values(
            at=now,
            actor=actor.name[:255],
            actor_id=actor.user_id,
            address=actor.address,
            action=action,
            target=target[:255],
            detail=dict(detail or {}),
        )
    )


def entries(conn: Tx, query: AuditQuery = EVERY) -> list[AuditEntry]:
    """A page of the entries ``query`` asks for, newest first (its limit
    bounded to AUDIT_PAGE)."""
    q = select(audit)
    if query.actions:
        q = q.where(audit.c.action.in_(query.actions))
    q = where_given(q, (audit.c.actor, query.actor), (audit.c.target, query.target))
    q = written_between(q, query.since, None)
    page = dataclasses.replace(query, limit=max(1, min(query.limit, AUDIT_PAGE)))
    return [entry_of(r) for r in conn.execute(newest_first(q, page)).mappings()]


def where_given(q: Select[Any], *equal: tuple[ColumnElement[Any], object]) -> Select[Any]:
    """``q`` narrowed to the rows whose column holds the value of each
    (column, value) pair, a pair whose value is None not narrowing it: a
    query's filters, each one left out when not asked for."""
    for column, value in equal:
        if value is not None:
            q = q.where(column == value)
    return q


def written_between(q: Select[Any], since: float | None, until: float | None) -> Select[Any]:
    """``q`` narrowed to the entries written at or after ``since`` and
    before ``until`` (None: no bound)."""
    if since is not None:
        q = q.where(audit.c.at >= since)
    if until is not None:
        q = q.where(audit.c.at < until)
    return q


def newest_first(q: Select[Any], page: Paging) -> Select[Any]:
    """``q``, a select of the trail's rows, narrowed to the ``page`` asked
    for: newest first, older than its ``before_id``, at most its ``limit``."""
    if page.before_id is not None:
        q = q.where(audit.c.id < page.before_id)
    return q.order_by(audit.c.id.desc()).limit(page.limit)


# An entry holds the trail's columns, by the same names.
_COLUMNS = tuple(field.name for field in dataclasses.fields(AuditEntry))


def entry_of(row: Mapping[str, Any]) -> AuditEntry:
    """The entry of a row of the trail (a row that may hold more columns)."""
    return AuditEntry(**{name: row[name] for name in _COLUMNS})


def purge(conn: Tx, before: float) -> int:
    """Entries older than ``before`` deleted (the sweep's, by the
    retention); how many."""
    return conn.execute(delete(audit).where(audit.c.at < before)).rowcount or 0
