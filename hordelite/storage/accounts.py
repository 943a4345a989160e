"""Users: the anonymous user, keys, and the records the user routes show."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import (
    bindparam,
    delete,
    false,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from hordelite.contract import refusals
from hordelite.contract.transfers import Transfer
from hordelite.contract.unicode_rules import fold_name
from hordelite.contract.user_edit import UserEdit
from hordelite.errors import RC, HordeError
from hordelite.storage import audit
from hordelite.storage.rules import Rules
from hordelite.storage.schema import (
    transfer_keys,
    users,
    workers,
)
from hordelite.storage.transaction import Tx, prepared

# Statements on the hot paths (every pop, submit and status) are built once
# with bind parameters: SQLAlchemy then only binds values, which halves the
# cost of each statement against building it anew.
USER_BY_KEY = prepared(select(users).where(users.c.key_hash == bindparam("key_hash")))
_USER_BY_NAME_KEY = prepared(select(users.c.id).where(users.c.name_key == bindparam("name_key")))

# A revoked key's hash is replaced by ``revoked:<user id>``: no key hashes to
# that (a sha256 is 64 hex digits), so the key stops authenticating with no
# check added to the authentication path, and the column stays unique.
REVOKED_PREFIX = "revoked:"

# The anonymous user's name: its key is held like any user's, so no
# registered user can take the name (decision 0073).
ANONYMOUS_NAME = "Anonymous"


def ensure_anonymous(conn: Tx, key_hash: str, now: float) -> None:
    """Create the anonymous user (id 0) once."""
    if conn.execute(select(users.c.id).where(users.c.id == 0)).first() is None:
        _insert_user(conn, ANONYMOUS_NAME, key_hash, now, id=0, anonymous=True)


def create_user(
    conn: Tx,
    username: str,
    key_hash: str,
    kudos: float,
    admin: bool,
    trusted: bool,
    now: float,
) -> int:
    """Insert a user; refused (UsernameAlreadyExists) when another user's
    name has its name's key (decision 0073)."""
    if conn.execute(_USER_BY_NAME_KEY, {"name_key": fold_name(username)}).first() is not None:
        raise refusals.username_exists(username)
    return _insert_user(
        conn, username, key_hash, now, kudos=kudos, admin=admin, trusted=trusted, anonymous=False
    )


def _insert_user(conn: Tx, username: str, key_hash: str, now: float, **columns: Any) -> int:
    """Insert a user with ``columns`` (the others at their defaults); its
    name key is its name's fold, set on every insert (decision 0073)."""
    result = conn.execute(
        insert(users)
        .values(
            username=username,
            name_key=fold_name(username),
            key_hash=key_hash,
            created=now,
            **columns,
        )
        .returning(users.c.id)
    )
    return int(result.scalar_one())


def authenticate(conn: Tx, key_hash: str, rules: Rules) -> Mapping[str, Any]:
    row = conn.execute(USER_BY_KEY, {"key_hash": key_hash}).mappings().first()
    if row is None:
        raise HordeError(RC.InvalidAPIKey)
    return admitted(row, rules)


def admitted(row: Mapping[str, Any], rules: Rules) -> Mapping[str, Any]:
    """The user of a key found, when it may use the horde now (the anonymous
    user only while ``allow_anonymous``)."""
    if row["anonymous"] and not rules.allow_anonymous:
        raise HordeError(RC.AnonymousDisabled)
    return row


@dataclasses.dataclass(frozen=True)
class UserRecord:
    """A user as the service reads it (never its key hash)."""

    id: int
    username: str
    anonymous: bool
    admin: bool
    trusted: bool
    kudos: float
    kudos_earned: float
    kudos_spent: float
    kudos_gifted: float
    kudos_received: float
    concurrency: int | None  # None: the horde's default for its kind of user
    created: float
    worker_ids: tuple[str, ...]
    active: bool  # its key authenticates (not revoked)

    @property
    def handle(self) -> str:
        """``name#id``, the way the AI Horde shows a user."""
        return f"{self.username}#{self.id}"


def user_by_key(conn: Tx, key_hash: str, rules: Rules) -> UserRecord:
    return _user_details(conn, authenticate(conn, key_hash, rules))


def user_by_id(conn: Tx, user_id: int) -> UserRecord:
    row = conn.execute(select(users).where(users.c.id == user_id)).mappings().first()
    if row is None:
        raise refusals.unknown_user(user_id)
    return _user_details(conn, row)


def _user_details(conn: Tx, row: Mapping[str, Any]) -> UserRecord:
    worker_ids = conn.execute(
        select(workers.c.id).where(workers.c.user_id == row["id"], workers.c.deleted == false())
    ).scalars()
    return user_record(row, worker_ids)


def user_record(row: Mapping[str, Any], worker_ids: Iterable[str]) -> UserRecord:
    """The record of a user's row and the ids of its workers."""
    return UserRecord(
        id=row["id"],
        username=row["username"],
        anonymous=bool(row["anonymous"]),
        admin=bool(row["admin"]),
        trusted=bool(row["trusted"]),
        kudos=row["kudos"],
        kudos_earned=row["kudos_earned"],
        kudos_spent=row["kudos_spent"],
        kudos_gifted=row["kudos_gifted"],
        kudos_received=row["kudos_received"],
        concurrency=row["concurrency"],
        created=row["created"],
        worker_ids=tuple(worker_ids),
        active=not row["key_hash"].startswith(REVOKED_PREFIX),
    )


def user_page(conn: Tx, by_kudos: bool, limit: int, offset: int) -> tuple[list[UserRecord], int]:
    """A page of every user, most kudos first (``by_kudos``, then by id) or
    oldest first (by id), and how many users there are; in three reads."""
    order = (users.c.kudos.desc(), users.c.id) if by_kudos else (users.c.id,)
    rows = conn.execute(select(users).order_by(*order).limit(limit).offset(offset)).mappings().all()
    owned: dict[int, list[str]] = {r["id"]: [] for r in rows}
    if owned:
        for worker_id, user_id in conn.execute(
            select(workers.c.id, workers.c.user_id)
            .where(workers.c.user_id.in_(list(owned)), workers.c.deleted == false())
            .order_by(workers.c.id)
        ):
            owned[user_id].append(worker_id)
    total = int(conn.execute(select(func.count()).select_from(users)).scalar_one())
    return [user_record(r, owned[r["id"]]) for r in rows], total


def transfer_kudos(
    conn: Tx, key_hash: str, transfer: Transfer, rules: Rules, now: float, operation_key: str | None
) -> float:
    """Move ``transfer.amount`` from the key's user to ``name#id``, with the
    AI Horde's refusals; the amount moved. Both balances are locked in id
    order (two transfers crossing each other cannot deadlock) and the
    source's balance is checked under its lock: concurrent transfers never
    take a balance below 0, and the sum of all balances never changes (the
    amounts are whole thousandths in integers, ``schema.Kudos``).

    Under an ``operation_key`` (Idempotency-Key) the user already sent the
    same transfer with, the first transfer's amount is answered and nothing
    moves again; a key sent with another transfer is 409
    OperationKeyReused. The key is looked up under the source's lock, so
    two retries racing each other move the kudos once."""
    source = authenticate(conn, key_hash, rules)
    dest = _transfer_target(conn, source, transfer)
    balances = dict(
        conn.execute(
            select(users.c.id, users.c.kudos)
            .where(users.c.id.in_([source["id"], dest["id"]]))
            .order_by(users.c.id)
            .with_for_update()
        ).all()
    )
    if operation_key is not None and _sent_before(conn, source["id"], operation_key, transfer):
        return transfer.amount
    if transfer.amount > balances[source["id"]]:
        raise HordeError(
            RC.KudosTransferNotEnough,
            f"amount: {transfer.amount:g} is more than your {balances[source['id']]:.2f} kudos.",
        )
    _move(conn, source["id"], dest["id"], transfer.amount)
    if operation_key is not None:
        conn.execute(
            insert(transfer_keys).values(
                user_id=source["id"],
                operation_key=operation_key,
                target_id=dest["id"],
                amount=transfer.amount,
                created=now,
            )
        )
    return transfer.amount


def _transfer_target(conn: Tx, source: Mapping[str, Any], transfer: Transfer) -> Mapping[str, Any]:
    """The user ``transfer`` goes to, with the AI Horde's refusals of the pair."""
    if source["anonymous"]:
        raise HordeError(RC.KudosTransferFromAnon)
    dest = conn.execute(select(users).where(users.c.id == transfer.user_id)).mappings().first()
    if dest is None or dest["username"].casefold() != transfer.name.casefold():
        raise HordeError(
            RC.InvalidTargetUsername,
            f"username: no user {transfer.name[:64]}#{transfer.user_id}.",
            errors={"username": "no such user"},
        )
    if dest["anonymous"]:
        raise HordeError(RC.KudosTransferToAnon)
    if dest["id"] == source["id"]:
        raise HordeError(RC.KudosTransferToSelf)
    return dest


def _move(conn: Tx, source_id: int, dest_id: int, amount: float) -> None:
    conn.execute(
        update(users)
        .where(users.c.id == source_id)
        .values(kudos=users.c.kudos - amount, kudos_gifted=users.c.kudos_gifted + amount)
    )
    conn.execute(
        update(users)
        .where(users.c.id == dest_id)
        .values(kudos=users.c.kudos + amount, kudos_received=users.c.kudos_received + amount)
    )


def _sent_before(conn: Tx, user_id: int, operation_key: str, transfer: Transfer) -> bool:
    """Whether the user already sent this transfer under ``operation_key``;
    409 OperationKeyReused when the key went with another transfer."""
    first = conn.execute(
        select(transfer_keys.c.target_id, transfer_keys.c.amount).where(
            transfer_keys.c.user_id == user_id, transfer_keys.c.operation_key == operation_key
        )
    ).first()
    if first is None:
        return False
    if (first.target_id, first.amount) != (transfer.user_id, transfer.amount):
        raise refusals.operation_key_reused()
    return True


# Run by every sweep: prepared, so that it costs a statement's send alone.
_PURGE_TRANSFER_KEYS = prepared(
    delete(transfer_keys).where(transfer_keys.c.created < bindparam("before"))
)


def purge_transfer_keys(conn: Tx, before: float) -> None:
    """Forget the transfers' Idempotency-Keys sent before ``before``."""
    conn.execute(_PURGE_TRANSFER_KEYS, {"before": before})


def modify_user(
    conn: Tx,
    key_hash: str,
    user_id: int,
    edit: UserEdit,
    rules: Rules,
    now: float,
    address: str | None = None,
) -> UserRecord:
    """Apply ``PUT /users/{id}``: an admin changes anything kept; a user only
    its own name. 403 NotModerator otherwise, 404 UserNotFound for no such
    user, 403 AnonForbiddenUserMod for the anonymous user.

    An admin's change is in the audit trail, in this transaction, as the
    admin acting from ``address``: ``kudos.grant`` for kudos, ``user.edit``
    for the rest; a user's new name of its own is no moderator's action."""
    editor = authenticate(conn, key_hash, rules)
    target = (
        conn.execute(select(users).where(users.c.id == user_id).with_for_update())
        .mappings()
        .first()
    )
    if target is None:
        raise refusals.unknown_user(user_id)
    if not editor["admin"] and (edit.needs_admin or editor["id"] != user_id):
        raise HordeError(RC.NotModerator, "Only an admin of this horde may change this user so.")
    if target["anonymous"]:
        raise HordeError(RC.AnonForbiddenUserMod, "The anonymous user cannot be changed.")
    values: dict[str, Any] = {}
    if edit.username is not None:
        values.update(_renamed(conn, target, edit.username))
    if edit.kudos is not None:
        values["kudos"] = users.c.kudos + edit.kudos
    for field, column in (
        ("concurrency", "concurrency"),
        ("trusted", "trusted"),
        ("moderator", "admin"),
    ):
        if getattr(edit, field) is not None:
            values[column] = getattr(edit, field)
    try:
        # A savepoint: a rename racing another onto the same key (two
        # transactions on PostgreSQL) is refused, not a failed transaction.
        with conn.begin_nested():
            conn.execute(update(users).where(users.c.id == user_id).values(**values))
    except IntegrityError:
        raise refusals.username_exists(edit.username or "") from None
    changed = user_by_id(conn, user_id)
    if edit.needs_admin or editor["id"] != user_id:
        _audit_user_edit(conn, audit.user_actor(editor, address), target, edit, changed, now)
    return changed


def _audit_user_edit(
    conn: Tx,
    actor: audit.Actor,
    before: Mapping[str, Any],
    edit: UserEdit,
    after: UserRecord,
    now: float,
) -> None:
    """An admin's ``PUT /users/{id}`` in the trail: ``kudos.grant`` with
    the amount and the balance before and after, ``user.edit`` with each
    other field asked for, ``[before, after]``."""
    target = audit.handle(before)
    if edit.kudos is not None:
        detail = {"amount": edit.kudos, "before": before["kudos"], "after": after.kudos}
        audit.record(conn, actor, "kudos.grant", target, now, detail)
    fields = {
        "username": (before["username"], after.username),
        "concurrency": (before["concurrency"], after.concurrency),
        "trusted": (bool(before["trusted"]), after.trusted),
        "moderator": (bool(before["admin"]), after.admin),
    }
    changed = {k: list(v) for k, v in fields.items() if getattr(edit, k) is not None}
    if changed:
        audit.record(conn, actor, "user.edit", target, now, changed)


def _renamed(conn: Tx, target: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The columns of a user's new name: refused when another user's name
    has its key (decision 0073); the same key spelt anew is the user's own."""
    key = fold_name(name)
    if key != target["name_key"]:
        taken = conn.execute(_USER_BY_NAME_KEY, {"name_key": key}).first()
        if taken is not None and taken.id != target["id"]:
            raise refusals.username_exists(name)
    return {"username": name, "name_key": key}
