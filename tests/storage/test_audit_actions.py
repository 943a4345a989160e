"""Moderators' actions in the audit trail, each in the transaction of its
change (decision 0077), on SQLite and PostgreSQL:

* an admin's user edit: ``kudos.grant`` with the balance before and after,
  ``user.edit`` with each field ``[before, after]``, as ``name#id`` from
  the address given; a user's own new name is not recorded;
* an edit refused (a name taken) leaves no entry: entry and change stand or
  fall together;
* an admin's pause and resume of a worker; maintenance, rename and delete of
  another user's worker; an owner's own maintenance is not recorded;
* an admin's worker message sent and deleted;
* the operator's kudos grant, key revoke and rotate and user creation, as
  ``cli`` with no address.
"""

from __future__ import annotations

import pytest
from sqlalchemy import update

from hordelite.contract.user_edit import UserEdit
from hordelite.contract.worker_edit import WorkerEdit
from hordelite.contract.worker_messages import NewMessage
from hordelite.errors import RC, HordeError
from hordelite.storage import admin, audit, messages, queries
from hordelite.storage.accounts import modify_user
from hordelite.storage.database import Database
from hordelite.storage.schema import users
from hordelite.storage.transaction import Tx
from tests.storage.helpers import NOW, RULES, create_user, new_key_hash, pop

pytestmark = pytest.mark.anyio

ADDRESS = "203.0.113.7"


async def _admin(db: Database, name: str = "mod") -> str:
    key_hash = await create_user(db, name)
    await db.write(_make_admin, key_hash)
    return key_hash


def _make_admin(conn: Tx, key_hash: str) -> None:
    conn.execute(update(users).where(users.c.key_hash == key_hash).values(admin=True))


async def _id(db: Database, key_hash: str) -> int:
    return (await db.read(queries.user_by_key, key_hash, RULES)).id


async def _trail(db: Database) -> list[audit.AuditEntry]:
    return await db.read(audit.entries)


async def test_an_admins_user_edit_is_recorded_with_the_fields_before_and_after(
    database: Database,
) -> None:
    mod = await _admin(database)
    alice = await _id(database, await create_user(database, "alice", kudos=10.0))
    edit = UserEdit(kudos=5.0, trusted=True, concurrency=3, username="alicia")
    await database.write(modify_user, mod, alice, edit, RULES, NOW, ADDRESS)

    grant, changed = sorted(await _trail(database), key=lambda e: e.action)
    mod_id = await _id(database, mod)
    for entry in (grant, changed):
        assert (entry.actor, entry.actor_id, entry.address) == (f"mod#{mod_id}", mod_id, ADDRESS)
        assert (entry.target, entry.at) == (f"alice#{alice}", NOW)
    assert grant.action == "kudos.grant"
    assert grant.detail == {"amount": 5.0, "before": 10.0, "after": 15.0}
    assert changed.action == "user.edit"
    assert changed.detail == {
        "username": ["alice", "alicia"],
        "concurrency": [None, 3],
        "trusted": [False, True],
    }


async def test_a_users_own_new_name_is_not_a_moderators_action(database: Database) -> None:
    alice = await create_user(database, "alice")
    await database.write(
        modify_user, alice, await _id(database, alice), UserEdit(username="al"), RULES, NOW
    )
    assert await _trail(database) == []


async def test_an_edit_refused_leaves_no_entry(database: Database) -> None:
    mod = await _admin(database)
    await create_user(database, "taken")
    alice = await _id(database, await create_user(database, "alice"))
    edit = UserEdit(kudos=5.0, username="TAKEN")
    with pytest.raises(HordeError) as refused:
        await database.write(modify_user, mod, alice, edit, RULES, NOW, ADDRESS)
    assert refused.value.rc is RC.UsernameAlreadyExists
    assert await _trail(database) == []
    assert (await database.read(queries.user_by_id, alice)).kudos == 0.0


async def test_an_admins_pause_and_moderation_of_anothers_worker_are_recorded(
    database: Database,
) -> None:
    mod = await _admin(database)
    owner = await create_user(database, "owner")
    worker_id = (await pop(database, owner, "w1", ["m"])).worker.id
    for edit in (
        WorkerEdit(paused=True),
        WorkerEdit(paused=False),
        WorkerEdit(maintenance=True),
        WorkerEdit(name="w2", name_key="w2", info="hi"),
    ):
        await database.write(queries.update_worker, mod, worker_id, edit, RULES, NOW, ADDRESS)
    await database.write(queries.delete_worker, mod, worker_id, RULES, NOW + 1, ADDRESS)

    trail = list(reversed(await _trail(database)))
    assert [e.action for e in trail] == [
        "worker.pause",
        "worker.resume",
        "worker.maintenance",
        "worker.edit",
        "worker.delete",
    ]
    assert {(e.target, e.address) for e in trail} == {(worker_id, ADDRESS)}
    assert trail[0].detail == {"name": "w1", "paused": [False, True]}
    assert trail[2].detail == {"name": "w1", "maintenance": [False, True]}
    assert trail[3].detail == {"worker": "w1", "name": ["w1", "w2"], "info": ["", "hi"]}
    assert trail[4].detail == {
        "name": "w2",
        "owner_id": await _id(database, owner),
        "jobs_given_back": 0,
    }


async def test_an_owners_own_maintenance_is_not_recorded(database: Database) -> None:
    # An admin owner too: its worker's state is its own, not moderation.
    for owner in (await create_user(database, "owner"), await _admin(database, "mod")):
        worker_id = (await pop(database, owner, f"w-{owner[:6]}", ["m"])).worker.id
        edit = WorkerEdit(maintenance=True)
        await database.write(queries.update_worker, owner, worker_id, edit, RULES, NOW, ADDRESS)
    assert await _trail(database) == []


async def test_the_operators_actions_are_recorded_as_cli(database: Database) -> None:
    made = await database.write(
        admin.create_named_user, "bob", new_key_hash(), 1.0, False, True, NOW, audit.CLI_ACTOR
    )
    assert isinstance(made, queries.UserRecord)
    await database.write(admin.grant_kudos, made.id, 4.0, audit.CLI_ACTOR, NOW + 1)
    await database.write(admin.set_key, made.id, new_key_hash(), audit.CLI_ACTOR, NOW + 2)
    await database.write(admin.set_key, made.id, None, audit.CLI_ACTOR, NOW + 3)

    trail = list(reversed(await _trail(database)))
    assert [(e.action, e.actor, e.actor_id, e.address) for e in trail] == [
        ("user.create", "cli", None, ""),
        ("kudos.grant", "cli", None, ""),
        ("key.rotate", "cli", None, ""),
        ("key.revoke", "cli", None, ""),
    ]
    assert {e.target for e in trail} == {f"bob#{made.id}"}
    assert trail[0].detail == {"kudos": 1.0, "admin": False, "trusted": True}
    assert trail[1].detail == {"amount": 4.0, "before": 1.0, "after": 5.0}
    assert trail[2].detail == {"was_active": True, "shared_keys_deleted": 0}
    assert trail[3].detail == {"was_active": True, "shared_keys_deleted": 0}


async def test_an_admins_worker_messages_sent_and_deleted_are_recorded(database: Database) -> None:
    mod = await _admin(database)
    owner = await create_user(database, "owner")
    worker_id = (await pop(database, owner, "w1", ["m"])).worker.id
    new = NewMessage(worker_id, "please update", "mods", 2)
    sent = await database.write(messages.send_message, mod, new, RULES, NOW, ADDRESS)
    assert await database.write(messages.delete_message, mod, sent.id, RULES, NOW + 1, ADDRESS)
    # A delete that finds nothing changes nothing: no entry.
    assert not await database.write(messages.delete_message, mod, sent.id, RULES, NOW + 2, ADDRESS)

    trail = list(reversed(await _trail(database)))
    assert [(e.action, e.target, e.address, e.at) for e in trail] == [
        ("message.send", worker_id, ADDRESS, NOW),
        ("message.delete", worker_id, ADDRESS, NOW + 1),
    ]
    assert trail[0].detail == {"message_id": sent.id, "message": "please update", "origin": "mods"}
    assert trail[1].detail == {"message_id": sent.id, "message": "please update"}
