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

from sqlalchemy import delete, insert, select

from hordelite.contract.limits import AUDIT_PAGE
from hordelite.storage.schema import audit
from hordelite.storage.transaction import Tx

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


def entries(
    conn: Tx,
    *,
    actions: tuple[str, ...] = (),
    actor: str | None = None,
    target: str | None = None,
    since: float | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[AuditEntry]:
    """A page of entries, newest first: those of ``actions`` (any when
    empty), by ``actor``, on ``target``, at or after ``since``, older than
    the entry ``before_id`` (the next page's cursor: the last id shown)."""
    query = select(audit).order_by(audit.c.id.desc()).limit(max(1, min(limit, AUDIT_PAGE)))
    if actions:
        query = query.where(audit.c.action.in_(actions))
    if actor is not None:
        query = query.where(audit.c.actor == actor)
    if target is not None:
        query = query.where(audit.c.target == target)
    if since is not None:
        query = query.where(audit.c.at >= since)
    if before_id is not None:
        query = query.where(audit.c.id < before_id)
    return [
        AuditEntry(
            id=r["id"],
            at=r["at"],
            actor=r["actor"],
            actor_id=r["actor_id"],
            address=r["address"],
            action=r["action"],
            target=r["target"],
            detail=r["detail"],
        )
        for r in conn.execute(query).mappings()
    ]


def purge(conn: Tx, before: float) -> int:
    """Entries older than ``before`` deleted (the sweep's, by the
    retention); how many."""
    return conn.execute(delete(audit).where(audit.c.at < before)).rowcount or 0
