"""Users: the anonymous user, keys, and the records the user routes show."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from sqlalchemy import (
    Connection,
    RowMapping,
    bindparam,
    false,
    insert,
    select,
)

from hordelite.contract import refusals
from hordelite.errors import RC, HordeError
from hordelite.storage.rules import Rules
from hordelite.storage.schema import (
    users,
    workers,
)

# Statements on the hot paths (every pop, submit and status) are built once
# with bind parameters: SQLAlchemy then only binds values, which halves the
# cost of each statement against building it anew.
USER_BY_KEY = select(users).where(users.c.key_hash == bindparam("key_hash"))

# A revoked key's hash is replaced by ``revoked:<user id>``: no key hashes to
# that (a sha256 is 64 hex digits), so the key stops authenticating with no
# check added to the authentication path, and the column stays unique.
REVOKED_PREFIX = "revoked:"


def ensure_anonymous(conn: Connection, key_hash: str, now: float) -> None:
    """Create the anonymous user (id 0) once."""
    if conn.execute(select(users.c.id).where(users.c.id == 0)).first() is None:
        conn.execute(
            insert(users).values(
                id=0, username="Anonymous", key_hash=key_hash, anonymous=True, created=now
            )
        )


def create_user(
    conn: Connection,
    username: str,
    key_hash: str,
    kudos: float,
    admin: bool,
    trusted: bool,
    now: float,
) -> int:
    result = conn.execute(
        insert(users)
        .values(
            username=username,
            key_hash=key_hash,
            kudos=kudos,
            admin=admin,
            trusted=trusted,
            anonymous=False,
            created=now,
        )
        .returning(users.c.id)
    )
    return int(result.scalar_one())


def authenticate(conn: Connection, key_hash: str, rules: Rules) -> RowMapping:
    row = conn.execute(USER_BY_KEY, {"key_hash": key_hash}).mappings().first()
    if row is None:
        raise HordeError(RC.InvalidAPIKey)
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
    concurrency: int | None  # None: the horde's default for its kind of user
    worker_ids: tuple[str, ...]
    active: bool  # its key authenticates (not revoked)

    @property
    def handle(self) -> str:
        """``name#id``, the way the AI Horde shows a user."""
        return f"{self.username}#{self.id}"


def user_by_key(conn: Connection, key_hash: str, rules: Rules) -> UserRecord:
    return _user_details(conn, authenticate(conn, key_hash, rules))


def user_by_id(conn: Connection, user_id: int) -> UserRecord:
    row = conn.execute(select(users).where(users.c.id == user_id)).mappings().first()
    if row is None:
        raise refusals.unknown_user(user_id)
    return _user_details(conn, row)


def _user_details(conn: Connection, row: RowMapping) -> UserRecord:
    worker_ids = conn.execute(
        select(workers.c.id).where(workers.c.user_id == row["id"], workers.c.deleted == false())
    ).scalars()
    return user_record(row, worker_ids)


def user_record(row: RowMapping, worker_ids: Iterable[str]) -> UserRecord:
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
        concurrency=row["concurrency"],
        worker_ids=tuple(worker_ids),
        active=not row["key_hash"].startswith(REVOKED_PREFIX),
    )
