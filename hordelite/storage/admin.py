"""The operator's operations on users (``hordelite keys``, ``hordelite
kudos``), each in the transaction the caller opened, answering the records
of ``accounts`` (``hordelite workers`` reads ``pool.list_workers``).

A key is stored only as its sha256 (decision 0009); a revoked key's hash is
replaced by ``revoked:<user id>`` (``accounts.REVOKED_PREFIX``).
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import false, or_, select, update

from hordelite.contract.audit_query import AuditQuery
from hordelite.contract.unicode_rules import fold_name
from hordelite.errors import RC, HordeError
from hordelite.storage import audit
from hordelite.storage.accounts import REVOKED_PREFIX, UserRecord, authenticate, user_record
from hordelite.storage.accounts import create_user as _create_user
from hordelite.storage.accounts import user_by_id as _user_by_id
from hordelite.storage.rules import Rules
from hordelite.storage.schema import RETIRED_NAME_KEY, users, workers
from hordelite.storage.shared_keys import delete_lent_keys
from hordelite.storage.transaction import Tx


def list_users(conn: Tx) -> list[UserRecord]:
    """Every user, by id (two reads, however many users)."""
    owned: defaultdict[int, list[str]] = defaultdict(list)
    for worker_id, user_id in conn.execute(
        select(workers.c.id, workers.c.user_id)
        .where(workers.c.deleted == false())
        .order_by(workers.c.id)
    ):
        owned[user_id].append(worker_id)
    rows = conn.execute(select(users).order_by(users.c.id)).mappings()
    return [user_record(r, owned[r["id"]]) for r in rows]


def users_named(conn: Tx, name: str) -> list[UserRecord]:
    """The users whose name is ``name`` compared by key (NFKC, case folded,
    default-ignorables removed: unicode_rules.fold_name), by id: the one
    that holds the key, and the users a migration found sharing it
    (decision 0073), whose keys are retired: a lookup of their name stays
    ambiguous, never silently one of them."""
    key = fold_name(name)
    rows = conn.execute(
        select(users)
        .where(or_(users.c.name_key == key, users.c.name_key.startswith(RETIRED_NAME_KEY)))
        .order_by(users.c.id)
    ).mappings()
    found = [r for r in rows if r["name_key"] == key or fold_name(r["username"]) == key]
    owned: defaultdict[int, list[str]] = defaultdict(list)
    if found:
        for worker_id, user_id in conn.execute(
            select(workers.c.id, workers.c.user_id)
            .where(workers.c.deleted == false(), workers.c.user_id.in_([r["id"] for r in found]))
            .order_by(workers.c.id)
        ):
            owned[user_id].append(worker_id)
    return [user_record(r, owned[r["id"]]) for r in found]


def create_named_user(
    conn: Tx,
    username: str,
    key_hash: str,
    kudos: float,
    admin: bool,
    trusted: bool,
    now: float,
    actor: audit.Actor,
) -> UserRecord | list[UserRecord]:
    """The new user, or the users already named so (nothing created); the
    creation is in the audit trail (``user.create``) as ``actor``'s."""
    if conn.dialect.name == "postgresql":
        # Two creations of one name at once: the second sees the first. Keyed
        # by the schema too, as names are unique within one horde's schema.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7002, hashtext(current_schema()))")
    taken = users_named(conn, username)
    if taken:
        return taken
    created = _user_by_id(conn, _create_user(conn, username, key_hash, kudos, admin, trusted, now))
    detail = {"kudos": kudos, "admin": admin, "trusted": trusted}
    audit.record(conn, actor, "user.create", created.handle, now, detail)
    return created


def set_key(conn: Tx, user_id: int, key_hash: str | None, actor: audit.Actor, now: float) -> int:
    """Store a new key's hash for the user, or revoke its key (None); the
    shared keys it lent with the old key go with it (decision 0058,
    amended): how many. In the audit trail as ``actor``'s ``key.rotate``
    or ``key.revoke``."""
    value = key_hash if key_hash is not None else f"{REVOKED_PREFIX}{user_id}"
    user = _user_by_id(conn, user_id)
    conn.execute(update(users).where(users.c.id == user_id).values(key_hash=value))
    lent = delete_lent_keys(conn, user_id)
    action = "key.revoke" if key_hash is None else "key.rotate"
    detail = {"was_active": user.active, "shared_keys_deleted": lent}
    audit.record(conn, actor, action, user.handle, now, detail)
    return lent


def grant_kudos(
    conn: Tx, user_id: int, amount: float, actor: audit.Actor, now: float
) -> tuple[float, float]:
    """Add ``amount`` (may be negative) to the user's kudos; its balance
    before and after. In the audit trail as ``actor``'s ``kudos.grant``."""
    balance = select(users.c.kudos).where(users.c.id == user_id)
    before = float(conn.execute(balance.with_for_update()).scalar_one())
    conn.execute(update(users).where(users.c.id == user_id).values(kudos=users.c.kudos + amount))
    after = float(conn.execute(balance).scalar_one())
    name = conn.execute(select(users.c.username).where(users.c.id == user_id)).scalar_one()
    detail = {"amount": amount, "before": before, "after": after}
    audit.record(conn, actor, "kudos.grant", f"{name}#{user_id}", now, detail)
    return before, after


def admin_audit(conn: Tx, key_hash: str, rules: Rules, query: AuditQuery) -> list[audit.AuditEntry]:
    """A page of the audit trail for the key's user, an admin: 403
    NotModerator for anyone else (the AI Horde's refusal of a moderator's
    route). A read: reading the trail is not recorded."""
    if not authenticate(conn, key_hash, rules)["admin"]:
        raise HordeError(RC.NotModerator, "Only an admin of this horde may read the audit trail.")
    return audit.entries(conn, query)
