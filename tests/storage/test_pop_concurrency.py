"""Concurrent pops never hand one job to two workers.

The pops run as concurrent ``Database.write`` calls: on PostgreSQL they run at
the same time on the pool's connections (skip-locked path), on SQLite the
writes are serialised.
"""

from __future__ import annotations

import anyio
import pytest

from hordelite.storage import queries
from hordelite.storage.database import Database
from tests.storage.helpers import create_user, pop, status, submit, text_request

pytestmark = pytest.mark.anyio


async def _pop_concurrently(
    db: Database, workers: list[tuple[str, str, list[str]]]
) -> list[queries.PopResult]:
    """Every (key hash, worker name, models) pops once, all at the same time."""
    results: list[queries.PopResult] = []
    start = anyio.Event()

    async def one(key_hash: str, name: str, models: list[str]) -> None:
        await start.wait()
        results.append(await pop(db, key_hash, name, models))

    async with anyio.create_task_group() as tg:
        for key_hash, name, models in workers:
            tg.start_soon(one, key_hash, name, models)
        start.set()
    return results


async def _owners(db: Database, count: int) -> list[str]:
    return [await create_user(db, f"owner{i}") for i in range(count)]


def _handed_out(results: list[queries.PopResult]) -> list[queries.PoppedJob]:
    return [r.job for r in results if r.job is not None]


async def test_a_request_for_one_job_is_handed_to_exactly_one_of_eight_concurrent_workers(
    database: Database,
) -> None:
    requester = await create_user(database, "alice")
    owners = await _owners(database, 8)
    request_id = await submit(database, requester, text_request(models=["m1"]))

    results = await _pop_concurrently(
        database, [(key, f"worker{i}", ["m1"]) for i, key in enumerate(owners)]
    )

    assert len(results) == 8
    handed = _handed_out(results)
    assert len(handed) == 1
    assert handed[0].request_id == request_id
    parts = await status(database, request_id)
    assert parts.request.remaining == 0
    assert len(parts.jobs) == 1


async def test_a_request_for_five_jobs_hands_out_exactly_five_distinct_jobs_to_twenty_concurrent_pops(
    database: Database,
) -> None:
    requester = await create_user(database, "alice")
    owners = await _owners(database, 20)
    request_id = await submit(database, requester, text_request(models=["m1"], params={"n": 5}))

    results = await _pop_concurrently(
        database, [(key, f"worker{i}", ["m1"]) for i, key in enumerate(owners)]
    )

    handed = _handed_out(results)
    assert len(handed) == 5
    assert len({job.id for job in handed}) == 5
    assert {job.request_id for job in handed} == {request_id}
    parts = await status(database, request_id)
    assert parts.request.remaining == 0
    assert sorted(j.id for j in parts.jobs) == sorted(job.id for job in handed)


async def test_a_request_listing_several_models_is_handed_out_only_n_times_to_workers_of_each_model(
    database: Database,
) -> None:
    requester = await create_user(database, "alice")
    owners = await _owners(database, 12)
    models = ["m1", "m2", "m3"]
    request_id = await submit(database, requester, text_request(models=models, params={"n": 2}))
    workers = [(key, f"worker{i}", [models[i % 3]]) for i, key in enumerate(owners)]

    results = await _pop_concurrently(database, workers)

    handed = _handed_out(results)
    assert len(handed) == 2
    assert len({job.id for job in handed}) == 2
    parts = await status(database, request_id)
    assert parts.request.remaining == 0
    assert len(parts.jobs) == 2
    for model in models:
        assert (await pop(database, owners[1], f"late-{model}", [model])).job is None
