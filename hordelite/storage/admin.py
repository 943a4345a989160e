"""The operator's operations on users and workers (``hordelite keys``,
``hordelite kudos``, ``hordelite workers``), each in the transaction the
caller opened, answering frozen records.

A key is stored only as its sha256 (decision 0009). A revoked key's hash is
replaced by ``revoked:<user id>``: no key hashes to that (a sha256 is 64 hex
digits), so the key stops authenticating with no check added to the
authentication path, and the column stays unique.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlalchemy import Connection, RowMapping, func, select, update

from hordelite.contract.presence import is_online
from hordelite.storage import queries
from hordelite.storage.schema import users, workers

REVOKED_PREFIX = "revoked:"


@dataclasses.dataclass(frozen=True)
class UserEntry:
    id: int
    username: str
    kudos: float
    anonymous: bool
    admin: bool
    trusted: bool
    active: bool  # its key authenticates (not revoked)
    workers: int

    @property
    def handle(self) -> str:
        """``name#id``, the way the AI Horde shows a user."""
        return f"{self.username}#{self.id}"


@dataclasses.dataclass(frozen=True)
class WorkerEntry:
    id: str
    name: str
    owner: str  # the owner's name#id
    online: bool
    last_check_in: float
    maintenance: bool
    models: tuple[str, ...]
    chat_model: str | None
    threads: int
    requests_fulfilled: int
    kudos_rewards: float


_WORKER_COUNT = (
    select(func.count())
    .select_from(workers)
    .where(workers.c.user_id == users.c.id)
    .scalar_subquery()
    .label("worker_count")
)
_USERS = select(users, _WORKER_COUNT)


def _entry(row: RowMapping) -> UserEntry:
    return UserEntry(
        id=row["id"],
        username=row["username"],
        kudos=row["kudos"],
        anonymous=bool(row["anonymous"]),
        admin=bool(row["admin"]),
        trusted=bool(row["trusted"]),
        active=not row["key_hash"].startswith(REVOKED_PREFIX),
        workers=int(row["worker_count"]),
    )


def list_users(conn: Connection) -> list[UserEntry]:
    return [_entry(r) for r in conn.execute(_USERS.order_by(users.c.id)).mappings()]


def user_by_id(conn: Connection, user_id: int) -> UserEntry | None:
    row = conn.execute(_USERS.where(users.c.id == user_id)).mappings().first()
    return None if row is None else _entry(row)


def users_named(conn: Connection, name: str) -> list[UserEntry]:
    """The users whose name is ``name`` compared case-insensitively (Unicode
    case folding, done here: SQLite's lower() folds only ASCII)."""
    folded = name.casefold()
    return [u for u in list_users(conn) if u.username.casefold() == folded]


def create_user(
    conn: Connection,
    username: str,
    key_hash: str,
    kudos: float,
    admin: bool,
    trusted: bool,
    now: float,
) -> UserEntry | list[UserEntry]:
    """The new user, or the users already named so (nothing created)."""
    if conn.dialect.name == "postgresql":
        # Two creations of one name at once: the second sees the first.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7002)")
    taken = users_named(conn, username)
    if taken:
        return taken
    user_id = queries.create_user(conn, username, key_hash, kudos, admin, trusted, now)
    entry = user_by_id(conn, user_id)
    assert entry is not None
    return entry


def set_key(conn: Connection, user_id: int, key_hash: str | None) -> None:
    """Store a new key's hash for the user, or revoke its key (None)."""
    value = key_hash if key_hash is not None else f"{REVOKED_PREFIX}{user_id}"
    conn.execute(update(users).where(users.c.id == user_id).values(key_hash=value))


def grant_kudos(conn: Connection, user_id: int, amount: float) -> float:
    """Add ``amount`` (may be negative) to the user's kudos; the new balance."""
    conn.execute(update(users).where(users.c.id == user_id).values(kudos=users.c.kudos + amount))
    return float(conn.execute(select(users.c.kudos).where(users.c.id == user_id)).scalar_one())


def list_workers(conn: Connection, now: float) -> Sequence[WorkerEntry]:
    """Every worker the horde knows, online or not, by name."""
    rows = conn.execute(
        select(workers, users.c.username)
        .join(users, users.c.id == workers.c.user_id)
        .order_by(workers.c.name)
    ).mappings()
    return [
        WorkerEntry(
            id=r["id"],
            name=r["name"],
            owner=f"{r['username']}#{r['user_id']}",
            online=is_online(r["online_until"], now),
            last_check_in=r["last_check_in"],
            maintenance=bool(r["maintenance"]),
            models=tuple(r["models"]),
            chat_model=r["chat_model"],
            threads=r["threads"],
            requests_fulfilled=r["requests_fulfilled"],
            kudos_rewards=r["kudos_rewards"],
        )
        for r in rows
    ]
