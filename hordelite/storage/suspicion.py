"""A worker's suspicion in storage (hordelite.contract.suspicion): added in
the transaction that found it, the worker paused there at the threshold
(audited ``worker.suspicion`` by the horde), reset by an admin's edit."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, update

from hordelite.contract.suspicion import (
    THRESHOLD,
    Suspicion,
    added,
    name_suspicions,
    too_fast,
)
from hordelite.storage import audit
from hordelite.storage.schema import users, workers
from hordelite.storage.transaction import Tx


def suspect(conn: Tx, worker_id: str, reasons: Sequence[Suspicion], now: float) -> bool:
    """Add ``reasons`` to the worker's suspicion; at THRESHOLD, pause it.
    Whether this paused it."""
    row = (
        conn.execute(
            select(
                workers.c.name, workers.c.suspicion, workers.c.suspicion_reasons, workers.c.paused
            )
            .where(workers.c.id == worker_id)
            .with_for_update()
        )
        .mappings()
        .first()
    )
    if row is None:
        return False
    count, seen = added(row["suspicion"], row["suspicion_reasons"], list(reasons))
    if count == row["suspicion"]:
        return False  # reasons that count once, already counted
    pauses = count >= THRESHOLD and not row["paused"]
    conn.execute(
        update(workers)
        .where(workers.c.id == worker_id)
        .values(suspicion=count, suspicion_reasons=seen, paused=bool(row["paused"]) or pauses)
    )
    if pauses:
        audit.record(
            conn,
            audit.HORDE_ACTOR,
            "worker.suspicion",
            worker_id,
            now,
            {"name": row["name"], "suspicion": count, "reasons": [r.name for r in reasons]},
        )
    return pauses


def judge_speed(
    conn: Tx, worker_id: str, tokens: float, seconds: float, bound: float, now: float
) -> bool:
    """A job done at ``tokens`` over ``seconds``: suspected past ``bound``
    tokens a second, unless the worker's owner is trusted. Whether this
    paused it. Nothing is read for a job within the bound."""
    if not too_fast(tokens, seconds, bound):
        return False
    trusted = conn.execute(
        select(users.c.trusted)
        .join(workers, workers.c.user_id == users.c.id)
        .where(workers.c.id == worker_id)
    ).scalar()
    if trusted:
        return False
    return suspect(conn, worker_id, [Suspicion.UNREASONABLY_FAST], now)


def judge_name(
    conn: Tx, worker_id: str, name: str, trusted: bool, words: frozenset[str], now: float
) -> None:
    """A new worker's name: suspected for its length or a word of ``words``
    (each reason once), unless its owner is trusted."""
    if trusted:
        return
    reasons = name_suspicions(name, words)
    if reasons:
        suspect(conn, worker_id, reasons, now)


def reset_values(paused_asked: bool | None) -> dict[str, object]:
    """The worker's columns an admin's ``reset_suspicion`` sets: no
    suspicion, and the pause lifted unless the same edit sets ``paused``."""
    values: dict[str, object] = {"suspicion": 0, "suspicion_reasons": 0}
    if paused_asked is None:
        values["paused"] = False
    return values
