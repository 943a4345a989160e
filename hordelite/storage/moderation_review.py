"""What the moderation review routes read (hordelite.contract.moderation_review),
for an admin (403 NotModerator for anyone else): the paused workers, the
prompt events (the audit trail's ``request.refused`` and
``request.flagged`` entries) and their notes, the worker suspicion events
(its ``worker.suspicion`` entries). A note is written with its audit entry
(``prompt.note``) in one transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import insert, select

from hordelite.contract.moderation_review import (
    OverviewQuery,
    PromptQuery,
    SuspicionQuery,
    suspicion_reasons,
)
from hordelite.contract.suspicion import Suspicion
from hordelite.errors import RC, HordeError
from hordelite.storage import audit as trail
from hordelite.storage.accounts import authenticate
from hordelite.storage.rules import Rules
from hordelite.storage.schema import audit, prompt_notes, users, workers
from hordelite.storage.transaction import Tx

PROMPT_ACTIONS = ("request.refused", "request.flagged")


@dataclasses.dataclass(frozen=True)
class Note:
    id: int
    event_id: int
    author_id: int | None
    note: str
    created: float


@dataclasses.dataclass(frozen=True)
class PausedWorker:
    row: Mapping[str, Any]
    reasons: tuple[tuple[Suspicion, int], ...]


def _admin(conn: Tx, key_hash: str, rules: Rules) -> Mapping[str, Any]:
    user = authenticate(conn, key_hash, rules)
    if not user["admin"]:
        raise HordeError(RC.NotModerator, "Only an admin of this horde may review moderation.")
    return user


def paused_workers(
    conn: Tx, key_hash: str, rules: Rules, query: OverviewQuery, now: float
) -> tuple[list[PausedWorker], int]:
    """The paused workers the query asks for, in its order, at most its
    limit, and how many there are in all. Paused workers are few: they are
    read whole and filtered here."""
    _admin(conn, key_hash, rules)
    if not query.text:
        return [], 0
    rows = select(
        workers,
        users.c.username.label("owner_name"),
        users.c.trusted.label("owner_trusted"),
    ).join(users, users.c.id == workers.c.user_id)
    rows = rows.where(workers.c.paused.is_(True), workers.c.deleted.is_(False))
    found = []
    for row in conn.execute(rows).mappings():
        if query.online is not None and (row["online_until"] > now) != query.online:
            continue
        reasons = tuple(suspicion_reasons(row["suspicion"], row["suspicion_reasons"]))
        if query.suspicion_ids and not {s.value for s, _n in reasons} & set(query.suspicion_ids):
            continue
        found.append(PausedWorker(row, reasons))
    order = {
        "suspicion": lambda w: (-w.row["suspicion"], w.row["name"]),
        "last_check_in": lambda w: (-w.row["last_check_in"], w.row["name"]),
        "name": lambda w: (w.row["name"], ""),
        "owner": lambda w: (w.row["owner_name"], w.row["name"]),
    }[query.sort]
    found.sort(key=order)
    return found[: query.limit], len(found)


def prompt_events(
    conn: Tx, key_hash: str, rules: Rules, query: PromptQuery
) -> tuple[list[trail.AuditEntry], dict[int, list[Note]]]:
    """A page of prompt events, newest first, and each one's notes, oldest first."""
    _admin(conn, key_hash, rules)
    if query.none:
        return [], {}
    q = trail.where_given(
        select(audit).where(audit.c.action.in_(PROMPT_ACTIONS)),
        (audit.c.id, query.event_id),
        (audit.c.actor_id, query.user_id),
        (audit.c.address, query.ipaddr),
    )
    q = trail.written_between(q, query.since, query.until)
    found = [trail.entry_of(r) for r in conn.execute(trail.newest_first(q, query)).mappings()]
    return found, _notes(conn, [e.id for e in found])


def _notes(conn: Tx, event_ids: Sequence[int]) -> dict[int, list[Note]]:
    notes: dict[int, list[Note]] = {}
    if not event_ids:
        return notes
    q = select(prompt_notes).where(prompt_notes.c.event_id.in_(event_ids))
    for r in conn.execute(q.order_by(prompt_notes.c.id)).mappings():
        notes.setdefault(r["event_id"], []).append(Note(**r))
    return notes


def add_note(
    conn: Tx, key_hash: str, rules: Rules, event_id: int, note: str, address: str, now: float
) -> Note:
    """An admin's note on a prompt event (404 PromptEventNotFound for no
    such event), audited ``prompt.note`` (its length, not its text)."""
    user = _admin(conn, key_hash, rules)
    exists = conn.execute(
        select(audit.c.id).where(audit.c.id == event_id, audit.c.action.in_(PROMPT_ACTIONS))
    ).first()
    if exists is None:
        raise HordeError(RC.PromptEventNotFound)
    note_id = int(
        conn.execute(
            insert(prompt_notes)
            .values(event_id=event_id, author_id=user["id"], note=note, created=now)
            .returning(prompt_notes.c.id)
        ).scalar_one()
    )
    detail = {"note_id": note_id, "chars": len(note)}
    trail.record(
        conn, trail.user_actor(user, address), "prompt.note", f"event:{event_id}", now, detail
    )
    return Note(note_id, event_id, user["id"], note, now)


def suspicion_events(
    conn: Tx, key_hash: str, rules: Rules, query: SuspicionQuery
) -> list[tuple[trail.AuditEntry, int | None]]:
    """A page of ``worker.suspicion`` entries, newest first, each with the
    id of its worker's owner (None: the worker is gone)."""
    _admin(conn, key_hash, rules)
    q = (
        select(audit, workers.c.user_id.label("owner_id"))
        .join(workers, workers.c.id == audit.c.target, isouter=True)
        .where(audit.c.action == "worker.suspicion")
    )
    q = trail.where_given(q, (audit.c.target, query.worker_id), (workers.c.user_id, query.user_id))
    page = conn.execute(trail.newest_first(q, query)).mappings()
    return [(trail.entry_of(r), r["owner_id"]) for r in page]
