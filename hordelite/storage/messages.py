"""Messages to workers: an admin sends one to a worker, its owner (and
admins) list them, its pops carry the active ones."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, false, insert, select

from hordelite.contract import refusals
from hordelite.contract.worker_messages import MessageQuery, NewMessage
from hordelite.errors import RC, HordeError
from hordelite.storage import audit
from hordelite.storage.accounts import authenticate
from hordelite.storage.rules import Rules
from hordelite.storage.schema import worker_messages, workers
from hordelite.storage.transaction import Tx


@dataclasses.dataclass(frozen=True)
class MessageRecord:
    id: str
    worker_id: str
    message: str
    origin: str | None
    created: float
    expires: float


def _record(row: Mapping[str, Any]) -> MessageRecord:
    return MessageRecord(
        row["id"], row["worker_id"], row["message"], row["origin"], row["created"], row["expires"]
    )


def _admin(conn: Tx, key_hash: str, rules: Rules, action: str) -> Mapping[str, Any]:
    user = authenticate(conn, key_hash, rules)
    if not user["admin"]:
        raise HordeError(RC.NotModerator, f"Only an admin of this horde may {action}.")
    return user


def send_message(
    conn: Tx, key_hash: str, new: NewMessage, rules: Rules, now: float, address: str | None = None
) -> MessageRecord:
    """An admin's message to a (not deleted) worker, lasting ``new.hours``;
    in the audit trail (``message.send``) from ``address``."""
    sender = _admin(conn, key_hash, rules, "send a worker a message")
    known = conn.execute(
        select(workers.c.id).where(workers.c.id == new.worker_id, workers.c.deleted == false())
    ).first()
    if known is None:
        raise refusals.unknown_worker(new.worker_id)
    sent = MessageRecord(
        id=str(uuid.uuid4()),
        worker_id=new.worker_id,
        message=new.message,
        origin=new.origin,
        created=now,
        expires=new.expires_at(now),
    )
    conn.execute(insert(worker_messages).values(**dataclasses.asdict(sent)))
    detail = {"message_id": sent.id, "message": sent.message, "origin": sent.origin}
    audit.record(
        conn, audit.user_actor(sender, address), "message.send", new.worker_id, now, detail
    )
    return sent


def list_messages(
    conn: Tx, key_hash: str, rules: Rules, query: MessageQuery, now: float
) -> list[MessageRecord]:
    """The page ``query`` asks for of the messages the key's user may read
    (an admin: every one; else those to its own workers), newest first; its
    ``worker_id`` narrows them to one worker, another user's being refused
    for a non-admin."""
    user = authenticate(conn, key_hash, rules)
    worker_id, validity = query.worker_id, query.validity
    q = select(worker_messages).join(workers, workers.c.id == worker_messages.c.worker_id)
    if worker_id is not None:
        owner = conn.execute(select(workers.c.user_id).where(workers.c.id == worker_id)).first()
        if owner is None:
            raise refusals.unknown_worker(worker_id)
        if owner.user_id != user["id"] and not user["admin"]:
            raise refusals.not_the_workers_owner()
        q = q.where(worker_messages.c.worker_id == worker_id)
    elif not user["admin"]:
        q = q.where(workers.c.user_id == user["id"])
    if validity == "active":
        q = q.where(worker_messages.c.expires > now)
    elif validity == "expired":
        q = q.where(worker_messages.c.expires <= now)
    q = q.order_by(worker_messages.c.created.desc(), worker_messages.c.id)
    return [_record(r) for r in conn.execute(q.limit(query.limit).offset(query.offset)).mappings()]


def message_by_id(conn: Tx, message_id: str) -> MessageRecord | None:
    row = (
        conn.execute(select(worker_messages).where(worker_messages.c.id == message_id))
        .mappings()
        .first()
    )
    return None if row is None else _record(row)


def delete_message(
    conn: Tx,
    key_hash: str,
    message_id: str,
    rules: Rules,
    now: float,
    address: str | None = None,
) -> bool:
    """An admin deletes a message; whether there was one. A delete that
    found one is in the audit trail (``message.delete``) from ``address``."""
    deleter = _admin(conn, key_hash, rules, "delete a worker's message")
    found = conn.execute(
        delete(worker_messages)
        .where(worker_messages.c.id == message_id)
        .returning(worker_messages.c.worker_id, worker_messages.c.message)
    ).first()
    if found is None:
        return False
    detail = {"message_id": message_id, "message": found.message}
    audit.record(
        conn, audit.user_actor(deleter, address), "message.delete", found.worker_id, now, detail
    )
    return True


def active_messages(conn: Tx, now: float, limit: int) -> list[MessageRecord]:
    """The messages not yet expired, newest first, at most ``limit``."""
    q = (
        select(worker_messages)
        .where(worker_messages.c.expires > now)
        .order_by(worker_messages.c.created.desc())
        .limit(limit)
    )
    return [_record(r) for r in conn.execute(q).mappings()]


def purge_messages(conn: Tx, before: float) -> None:
    """Delete the messages that expired before ``before``."""
    conn.execute(delete(worker_messages).where(worker_messages.c.expires < before))
