"""The horde's modes in storage (hordelite.contract.modes): read, set with
their audit entry in the same transaction, and the one look-up the closed
door to new workers needs."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import false, insert, select, update

from hordelite.contract.modes import Modes
from hordelite.errors import RC, HordeError
from hordelite.storage import audit
from hordelite.storage.accounts import authenticate
from hordelite.storage.rules import Rules
from hordelite.storage.schema import horde_modes, users, workers
from hordelite.storage.transaction import Tx

_ROW = 1


def read_modes(conn: Tx) -> Modes:
    """The modes as stored; all off before they were first set."""
    row = conn.execute(select(horde_modes).where(horde_modes.c.id == _ROW)).mappings().first()
    if row is None:
        return Modes()
    return Modes(bool(row["maintenance"]), bool(row["invite_only"]), bool(row["raid"]))


def set_modes(
    conn: Tx, changes: Mapping[str, bool], actor: audit.Actor, now: float
) -> tuple[Modes, Modes]:
    """Set the modes of ``changes`` (by mode name) and record ``mode.set``;
    the modes before and after."""
    # The row is locked (PostgreSQL) before it is read: two changes at once
    # are applied one after the other, each audited with what it found.
    row = (
        conn.execute(select(horde_modes).where(horde_modes.c.id == _ROW).with_for_update())
        .mappings()
        .first()
    )
    before = (
        Modes()
        if row is None
        else Modes(bool(row["maintenance"]), bool(row["invite_only"]), bool(row["raid"]))
    )
    after = Modes(**{**_as_dict(before), **changes})
    values = {**_as_dict(after), "changed": now}
    if row is None:
        conn.execute(insert(horde_modes).values(id=_ROW, version=1, **values))
    else:
        conn.execute(
            update(horde_modes)
            .where(horde_modes.c.id == _ROW)
            .values(version=horde_modes.c.version + 1, **values)
        )
    audit.record(
        conn,
        actor,
        "mode.set",
        "horde",
        now,
        {"set": dict(changes), "before": _as_dict(before), "after": _as_dict(after)},
    )
    return before, after


def _as_dict(modes: Modes) -> dict[str, bool]:
    return {"maintenance": modes.maintenance, "invite_only": modes.invite_only, "raid": modes.raid}


def may_register(conn: Tx, key_hash: str, name_key: str) -> bool:
    """Whether a pop of the key's user under this name may go on while the
    horde is closed to new workers: the name is a worker's already (its
    pop registers nothing; whose it is, the pop checks), or the user is
    trusted or an admin. An unknown or the anonymous key goes on too: the
    pop refuses it (InvalidAPIKey, AnonForbiddenWorker)."""
    user = (
        conn.execute(
            select(users.c.trusted, users.c.admin, users.c.anonymous).where(
                users.c.key_hash == key_hash
            )
        )
        .mappings()
        .first()
    )
    # The pop refuses an unknown key, and the anonymous user, as always.
    if user is None or user["anonymous"] or user["trusted"] or user["admin"]:
        return True
    known = conn.execute(
        select(workers.c.id).where(workers.c.name_key == name_key, workers.c.deleted == false())
    ).first()
    return known is not None


def modes_as_admin(
    conn: Tx, key_hash: str, changes: Mapping[str, bool], address: str, rules: Rules, now: float
) -> tuple[Modes, Modes]:
    """``set_modes`` by the key's user: 401 InvalidAPIKey for an unknown
    key, 403 NotModerator unless an admin."""
    user = authenticate(conn, key_hash, rules)
    if not user["admin"] or user["anonymous"]:
        raise HordeError(RC.NotModerator, "Only an admin of this horde may change its modes.")
    actor = audit.Actor(f"{user['username']}#{user['id']}", user["id"], address)
    return set_modes(conn, changes, actor, now)


def modes_for(conn: Tx, key_hash: str, rules: Rules) -> Modes:
    """The modes, read for the key's user: 401 InvalidAPIKey for an unknown
    key, 403 NotModerator unless an admin (who alone is shown raid mode)."""
    user = authenticate(conn, key_hash, rules)
    if not user["admin"] or user["anonymous"]:
        raise HordeError(RC.NotModerator, "Only an admin of this horde may see raid mode.")
    return read_modes(conn)
