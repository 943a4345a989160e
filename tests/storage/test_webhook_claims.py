"""Claiming owed webhook calls (hordelite.storage.webhooks): the longest due
first, and at most ``per_user`` of one requester's in flight, counting those
its caller is making (``busy``), so that one requester's owed calls never
stand in front of another's."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.schema import requests
from hordelite.storage.transaction import Tx
from hordelite.storage.webhooks import claim_calls
from tests.storage.helpers import NOW, RULES, create_user, submit, text_request

pytestmark = pytest.mark.anyio

HOOK = "https://example.org/hook"


async def owe(database: Database, key_hash: str, count: int, at: float) -> list[str]:
    """``count`` requests of the user with a webhook call owed, due from
    ``at`` in the order made."""
    ids = [await submit(database, key_hash, text_request(webhook=HOOK)) for _ in range(count)]

    def due(conn: Tx) -> None:
        for i, request_id in enumerate(ids):
            conn.execute(
                update(requests).where(requests.c.id == request_id).values(hook_due=at + i)
            )

    await database.write(due)
    return ids


async def user_id(database: Database, key_hash: str) -> int:
    return (await database.read(queries.user_by_key, key_hash, RULES)).id


async def test_a_requester_at_its_bound_is_passed_over_for_the_calls_behind(
    database: Database,
) -> None:
    mallory = await create_user(database, "mallory", kudos=100)
    alice = await create_user(database, "alice", kudos=100)
    await owe(database, mallory, 5, NOW)
    [alices] = await owe(database, alice, 1, NOW + 10)
    busy = {(await user_id(database, mallory), ""): 2}

    # A claim of 2 sees past her 5 calls, longer due.
    claimed = await database.write(claim_calls, NOW + 20, 2, busy, 2)

    assert [(c.request_id, c.user_id, c.attempt) for c in claimed] == [
        (alices, await user_id(database, alice), 1)
    ]


async def test_one_claim_takes_at_most_the_bound_of_one_requesters_calls(
    database: Database,
) -> None:
    mallory = await create_user(database, "mallory", kudos=100)
    alice = await create_user(database, "alice", kudos=100)
    mallorys = await owe(database, mallory, 5, NOW)
    [alices] = await owe(database, alice, 1, NOW + 10)

    claimed = await database.write(claim_calls, NOW + 20, 16, {}, 2)

    assert [c.request_id for c in claimed] == [*mallorys[:2], alices]
    # Mallory's others stay due, untried: the next claim (her calls ended) takes them.
    again = await database.write(claim_calls, NOW + 21, 16, {}, 2)
    assert [(c.request_id, c.attempt) for c in again] == [(r, 1) for r in mallorys[2:4]]
