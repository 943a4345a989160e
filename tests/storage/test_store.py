"""The Store, storage's one interface: named keyword-only typed operations
answering records, one transaction each, on SQLite and PostgreSQL."""

from __future__ import annotations

import inspect
import uuid
from typing import Any

import anyio
import pytest

from hordelite.errors import RC, HordeError
from hordelite.horde.service import new_text_request
from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.store import Store
from tests.storage.helpers import (
    NOW,
    RULES,
    billions,
    heard_statements,
    job_submit,
    new_key_hash,
    pop_request,
    text_request,
)

pytestmark = pytest.mark.anyio


def _store(db: Database) -> Store:
    return Store(db, RULES, billions)


def _operations() -> list[tuple[str, Any]]:
    return [
        (name, fn)
        for name, fn in inspect.getmembers(Store, inspect.isfunction)
        if not name.startswith("_")
    ]


def test_every_store_operation_is_keyword_only_typed_and_documented() -> None:
    operations = _operations()
    assert len(operations) > 20
    for name, fn in operations:
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        assert params[0].name == "self", name
        for p in params[1:]:
            assert p.kind is inspect.Parameter.KEYWORD_ONLY, f"{name}({p.name})"
            assert p.annotation is not inspect.Parameter.empty, f"{name}({p.name})"
        assert signature.return_annotation is not inspect.Signature.empty, name
        assert fn.__doc__, name


async def _user(store: Store, name: str, kudos: float = 0.0) -> tuple[str, int]:
    key_hash = new_key_hash()
    user_id = await store.create_user(
        username=name, key_hash=key_hash, kudos=kudos, admin=False, trusted=False, now=NOW
    )
    return key_hash, user_id


def _new(models: list[str], operation_key: str | None = None) -> queries.NewRequest:
    return new_text_request(text_request(models=models), lambda req: 0.0, operation_key)


async def _submit(store: Store, key_hash: str, new: queries.NewRequest) -> queries.Submitted:
    return await store.submit_request(
        key_hash=key_hash,
        new=new,
        request_id=str(uuid.uuid4()),
        now=NOW,
        upfront_max_length=512,
        client_agent="test:1:test",
        online=None,
    )


async def test_a_request_goes_round_through_the_store_answering_its_records(
    database: Database,
) -> None:
    store = _store(database)
    alice, alice_id = await _user(store, "alice", kudos=100)
    owner, _ = await _user(store, "owner")

    user = await store.user_by_key(key_hash=alice)
    assert isinstance(user, queries.UserRecord)
    assert (user.id, user.username, user.kudos) == (alice_id, "alice", 100)
    assert await store.user_by_id(user_id=alice_id) == user

    submitted = await _submit(store, alice, _new(["m1"]))
    assert isinstance(submitted, queries.Submitted)
    assert not submitted.replayed

    popped = await store.pop_job(
        key_hash=owner, pop=pop_request("w1", ["m1"]), now=NOW, poll_left=None
    )
    assert isinstance(popped, queries.PopResult)
    assert popped.job is not None
    assert popped.job.request_id == submitted.request_id

    result = await store.submit_job(
        key_hash=owner,
        sub=job_submit(popped.job.id, "The end."),
        now=NOW + 1,
        lease_until=None,
        verdict=None,
    )
    assert result.request_id == submitted.request_id
    assert result.request_ended

    parts = await store.request_status(
        request_id=submitted.request_id,
        kind="text",
        now=NOW + 2,
        with_position=True,
        with_free_threads=False,
        online=[],
    )
    assert isinstance(parts, queries.StatusSnapshot)
    assert parts.request.state == "done"
    assert [j.state for j in parts.jobs] == ["done"]


async def test_first_request_answers_the_first_request_and_refuses_another_fingerprint(
    database: Database,
) -> None:
    store = _store(database)
    alice, _ = await _user(store, "alice", kudos=100)
    new = _new(["m1"], operation_key="op-1")
    assert new.fingerprint is not None

    none_yet = await store.first_request(
        key_hash=alice, operation_key="op-1", kind="text", fingerprint=new.fingerprint
    )
    assert none_yet is None
    submitted = await _submit(store, alice, new)

    first = await store.first_request(
        key_hash=alice, operation_key="op-1", kind="text", fingerprint=new.fingerprint
    )
    assert isinstance(first, queries.FirstRequest)
    assert first.id == submitted.request_id
    assert first.models == ("m1",)

    with pytest.raises(HordeError) as refused:
        await store.first_request(
            key_hash=alice, operation_key="op-1", kind="text", fingerprint="another"
        )
    assert refused.value.rc is RC.OperationKeyReused
    assert refused.value.rc.status == 409
    with pytest.raises(HordeError) as unknown:
        await store.first_request(
            key_hash=new_key_hash(), operation_key="op-1", kind="text", fingerprint=None
        )
    assert unknown.value.rc is RC.InvalidAPIKey


async def test_a_store_pop_on_postgresql_skips_locked_requests_without_being_told(
    postgresql_database: Database,
) -> None:
    store = _store(postgresql_database)
    alice, _ = await _user(store, "alice", kudos=100)
    owners = [(await _user(store, f"owner{i}"))[0] for i in range(6)]
    for _ in range(3):
        await _submit(store, alice, _new(["m1"]))
    results: list[queries.PopResult] = []
    start = anyio.Event()

    async def one(key_hash: str, name: str) -> None:
        await start.wait()
        pop = pop_request(name, ["m1"])
        results.append(await store.pop_job(key_hash=key_hash, pop=pop, now=NOW, poll_left=None))

    with heard_statements(postgresql_database) as seen:
        async with anyio.create_task_group() as tg:
            for i, key_hash in enumerate(owners):
                tg.start_soon(one, key_hash, f"w{i}")
            start.set()

    handed = [r.job for r in results if r.job is not None]
    assert len(handed) == 3
    assert len({j.id for j in handed}) == 3
    assert len({j.request_id for j in handed}) == 3
    assert any("SKIP LOCKED" in s for s in seen)


async def test_a_store_pop_on_sqlite_hands_out_its_job_with_no_locks_to_skip(
    sqlite_database: Database,
) -> None:
    store = _store(sqlite_database)
    alice, _ = await _user(store, "alice", kudos=100)
    owner, _ = await _user(store, "owner")
    await _submit(store, alice, _new(["m1"]))
    result = await store.pop_job(
        key_hash=owner, pop=pop_request("w1", ["m1"]), now=NOW, poll_left=None
    )
    assert result.job is not None


def _walks(statements: list[str]) -> list[str]:
    """The candidate reads among ``statements``: each a walk of one queue
    class, reading the queue in ix_queue_order's order."""
    return [s for s in statements if "FROM queue" in s and "ORDER BY queue.anonymous" in s]


async def test_a_pop_walks_the_any_model_class_only_while_a_request_naming_no_model_is_queued(
    database: Database,
) -> None:
    store = _store(database)
    alice, _ = await _user(store, "alice", kudos=100)
    owner, _ = await _user(store, "owner")
    named = await _submit(store, alice, _new(["m1"]))

    async def pop(now: float) -> tuple[str | None, int]:
        """The popped job's request, and how many candidate walks the pop read."""
        with heard_statements(database) as heard:
            popped = await store.pop_job(
                key_hash=owner, pop=pop_request("w1", ["m1"]), now=now, poll_left=None
            )
        return (popped.job.request_id if popped.job else None), len(_walks(heard))

    # m1's class; none for requests naming no model
    assert await pop(NOW) == (named.request_id, 1)
    anything = await _submit(store, alice, _new([]))
    # m1's class, then the class of requests naming no model
    assert await pop(NOW + 1) == (anything.request_id, 2)
