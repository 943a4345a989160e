"""Shared keys in storage (decision 0058): created, read, changed and deleted
by their owner, and resolved when a request is sent with one.

A key is stored by its hash, as users' keys are: the id its owner hands out
is the credential, and the database never holds it. A request sent with a
shared key is the owner's (``requester``): the owner's concurrency, budgets
and kudos apply, each request holds its price reserved on the key while it
is in flight (``reserved``), and each job settled for it spends the key's
kudos (``spend``), in the settlement's transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, bindparam, delete, func, insert, select, type_coerce, update

from hordelite.contract import shared_keys as rules_of_keys
from hordelite.contract.limits import SHARED_KEYS_PER_USER
from hordelite.contract.shared_keys import SharedKeyEdit, SharedKeyTerms
from hordelite.errors import RC, HordeError
from hordelite.storage.accounts import (
    REVOKED_PREFIX,
    USER_BY_KEY,
    UserRecord,
    admitted,
    authenticate,
    user_by_id,
)
from hordelite.storage.rules import Rules
from hordelite.storage.schema import Kudos, jobs, requests, shared_keys, users
from hordelite.storage.transaction import Tx, prepared

_KEY = prepared(select(shared_keys).where(shared_keys.c.key_hash == bindparam("key_hash")))
_KEY_LOCKED = prepared(_KEY.with_for_update())

# What a key's requests in flight hold reserved (contract.shared_keys): each
# job not yet settled of its waiting requests, and each job still out of
# its cancelled ones (a cancel leaves its jobs out: they settle, and charge,
# as they come in; every other end aborts them). Both read along
# ix_requests_shared_key (an equality on the state, so that the key's
# requests lead, not every job in progress).
_KEY_REQUESTS = and_(
    requests.c.shared_key.is_not(None), requests.c.shared_key == bindparam("key_hash")
)
_RESERVED = prepared(
    select(
        select(
            func.coalesce(
                func.sum(
                    # Kudos (thousandths, decision 0072) times a count are kudos.
                    type_coerce(
                        requests.c.shared_price * (requests.c.n - requests.c.finished), Kudos
                    )
                ),
                0.0,
            )
        )
        .where(_KEY_REQUESTS, requests.c.state == "waiting")
        .scalar_subquery()
        .label("waiting"),
        select(func.coalesce(func.sum(requests.c.shared_price), 0.0))
        .select_from(jobs.join(requests, requests.c.id == jobs.c.request_id))
        .where(_KEY_REQUESTS, requests.c.state == "cancelled", jobs.c.state == "processing")
        .scalar_subquery()
        .label("out"),
    )
)


@dataclasses.dataclass(frozen=True)
class SharedKeyRecord:
    """A shared key as its details show it (its id is the caller's)."""

    owner: str  # name#id
    name: str
    kudos: float
    utilized: float
    expiry: float | None
    max_text_tokens: int
    max_image_pixels: int
    max_image_steps: int


def _record(conn: Tx, row: Mapping[str, Any]) -> SharedKeyRecord:
    name = conn.execute(select(users.c.username).where(users.c.id == row["user_id"])).scalar_one()
    return SharedKeyRecord(
        owner=f"{name}#{row['user_id']}",
        name=row["name"],
        kudos=row["kudos"],
        utilized=row["utilized"],
        expiry=row["expiry"],
        max_text_tokens=row["max_text_tokens"],
        max_image_pixels=row["max_image_pixels"],
        max_image_steps=row["max_image_steps"],
    )


def _unknown() -> HordeError:
    # The AI Horde's answer to an unknown shared key.
    return HordeError(RC.InvalidAPIKey, "No shared key with this id.")


def create_shared_key(
    conn: Tx,
    owner_hash: str,
    key_hash: str,
    nonce: str,
    terms: SharedKeyTerms,
    rules: Rules,
    now: float,
) -> SharedKeyRecord:
    """A new key of the owner's, its id derived from ``nonce`` (kept) and
    the owner's key; 403 AnonForbidden for the anonymous user, 403
    Forbidden past SHARED_KEYS_PER_USER."""
    user = authenticate(conn, owner_hash, rules)
    if user["anonymous"]:
        raise HordeError(RC.AnonForbidden, "The anonymous user cannot lend a shared key.")
    held = conn.execute(
        select(func.count()).where(shared_keys.c.user_id == user["id"])
    ).scalar_one()
    if held >= SHARED_KEYS_PER_USER:
        raise HordeError(
            RC.Forbidden, f"You cannot have more than {SHARED_KEYS_PER_USER} shared keys."
        )
    conn.execute(
        insert(shared_keys).values(
            key_hash=key_hash,
            user_id=user["id"],
            id_nonce=nonce,
            name=terms.name,
            kudos=float(terms.kudos),
            utilized=0.0,
            expiry=terms.expires_at(now),
            max_text_tokens=terms.max_text_tokens,
            max_image_pixels=terms.max_image_pixels,
            max_image_steps=terms.max_image_steps,
            created=now,
        )
    )
    return _record(conn, conn.execute(_KEY, {"key_hash": key_hash}).mappings().one())


def shared_key(conn: Tx, key_hash: str) -> SharedKeyRecord:
    """The key's details; 401 InvalidAPIKey when there is none."""
    row = conn.execute(_KEY, {"key_hash": key_hash}).mappings().first()
    if row is None:
        raise _unknown()
    return _record(conn, row)


def _owned(conn: Tx, owner_hash: str, key_hash: str, rules: Rules) -> Mapping[str, Any]:
    """The key, locked, when the owner's key is its owner's; 401
    InvalidAPIKey for an unknown key, 403 WrongCredentials for another's."""
    row = conn.execute(_KEY_LOCKED, {"key_hash": key_hash}).mappings().first()
    if row is None:
        raise _unknown()
    user = authenticate(conn, owner_hash, rules)
    if row["user_id"] != user["id"]:
        raise HordeError(RC.WrongCredentials, "This shared key belongs to another user.")
    return row


def edit_shared_key(
    conn: Tx,
    owner_hash: str,
    key_hash: str,
    edit: SharedKeyEdit,
    rules: Rules,
    now: float,
) -> SharedKeyRecord:
    """The key as its owner's PATCH left it (an expiry counts from now)."""
    _owned(conn, owner_hash, key_hash, rules)
    values: dict[str, object] = {
        key: getattr(edit, key)
        for key in ("name", "max_text_tokens", "max_image_pixels", "max_image_steps")
        if getattr(edit, key) is not None
    }
    if edit.kudos is not None:
        values["kudos"] = float(edit.kudos)
    if edit.expiry_days is not None:
        values["expiry"] = rules_of_keys.expires_at(edit.expiry_days, now)
    conn.execute(update(shared_keys).where(shared_keys.c.key_hash == key_hash).values(**values))
    return _record(conn, conn.execute(_KEY, {"key_hash": key_hash}).mappings().one())


def lent_keys(conn: Tx, user_id: int) -> list[tuple[str, str]]:
    """The user's keys whose ids can be derived again: (hash, nonce) each,
    oldest first."""
    rows = conn.execute(
        select(shared_keys.c.key_hash, shared_keys.c.id_nonce)
        .where(shared_keys.c.user_id == user_id, shared_keys.c.id_nonce.is_not(None))
        .order_by(shared_keys.c.created, shared_keys.c.key_hash)
    )
    return [(key_hash, nonce) for key_hash, nonce in rows]


def delete_lent_keys(conn: Tx, user_id: int) -> int:
    """Delete every key the user lent (its own key is rotated or revoked:
    the keys made with it go too); how many. Requests sent with them stop
    spending them, as after a delete."""
    result = conn.execute(delete(shared_keys).where(shared_keys.c.user_id == user_id))
    return int(result.rowcount)


def delete_shared_key(conn: Tx, owner_hash: str, key_hash: str, rules: Rules) -> None:
    """Delete the owner's key: requests sent with it stop spending it."""
    _owned(conn, owner_hash, key_hash, rules)
    conn.execute(delete(shared_keys).where(shared_keys.c.key_hash == key_hash))


def requester(
    conn: Tx, key_hash: str, rules: Rules, now: float | None, lock: bool = False
) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """Who a request sent with this key is queued for: the key's user, or
    for a shared key its owner, with the key (checked usable at ``now``: 403
    SharedKeyEmpty, SharedKeyExpired; None: not checked, for a lookup).
    Raises as ``authenticate`` otherwise.

    ``lock``: an admission's. The shared key's row is locked (PostgreSQL)
    for the rest of the transaction: what its requests in flight hold
    (``reserved``) is read, and a new one added, by one admission at a time."""
    user = conn.execute(USER_BY_KEY, {"key_hash": key_hash}).mappings().first()
    if user is not None:  # the common case: one read, as authenticate's
        return admitted(user, rules), None
    read = _KEY_LOCKED if lock else _KEY
    key = conn.execute(read, {"key_hash": key_hash}).mappings().first()
    if key is None:
        raise HordeError(RC.InvalidAPIKey)
    owner = conn.execute(select(users).where(users.c.id == key["user_id"])).mappings().one()
    if owner["key_hash"].startswith(REVOKED_PREFIX):  # its owner's own key is revoked
        raise HordeError(RC.InvalidAPIKey)
    if now is not None:
        rules_of_keys.check_usable(key["kudos"], key["expiry"], now)
    return owner, key


def requester_by_key(
    conn: Tx,
    key_hash: str,
    rules: Rules,
    now: float | None,
    max_length: int | None = None,
    quote: float | None = None,
) -> UserRecord:
    """The user a request sent with this key would be queued for (a shared
    key's lender), as ``user_by_key`` shows a user, for the routes that
    check a request before it is queued (a dry run, a chat request's images).
    A shared key is checked as its admission would check it: usable, and
    with ``max_length`` and ``quote`` (a dry run, as the AI Horde checks
    one), its limit and the kudos it has left; ``now`` None: not checked (a
    lookup). Nothing is written."""
    user, shared = requester(conn, key_hash, rules, now)
    if shared is not None and max_length is not None and quote is not None:
        rules_of_keys.check_request(
            shared["kudos"], reserved(conn, shared), shared["max_text_tokens"], max_length, quote
        )
    return user_by_id(conn, user["id"])


def reserved(conn: Tx, key: Mapping[str, Any]) -> float:
    """The kudos ``key``'s requests in flight hold reserved on it (0 for an
    unlimited key, which reserves nothing)."""
    if key["kudos"] == rules_of_keys.UNLIMITED:
        return 0.0
    row = conn.execute(_RESERVED, {"key_hash": key["key_hash"]}).one()
    return float(row.waiting or 0.0) + float(row.out or 0.0)


def spend(conn: Tx, key_hash: str, cost: float) -> None:
    """The key paid ``cost`` for a settled job (gone keys spend nothing)."""
    row = conn.execute(_KEY_LOCKED, {"key_hash": key_hash}).mappings().first()
    if row is None or cost <= 0:
        return
    conn.execute(
        update(shared_keys)
        .where(shared_keys.c.key_hash == key_hash)
        .values(
            kudos=rules_of_keys.spent(row["kudos"], cost),
            utilized=round(row["utilized"] + cost, 2),
        )
    )
