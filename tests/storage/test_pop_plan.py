"""A pop's cost does not grow with the waiting requests it cannot serve.

Asserted on the query plan, not on time: the candidate query walks
``ix_queue_order`` for the worker's model in the pop's order (no sort of the
queue), so requests for other models are never read.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

from sqlalchemy import insert

from hordelite.horde.service import new_text_request
from hordelite.storage import pop, queries
from hordelite.storage.database import Database
from hordelite.storage.schema import queue, requests, users
from hordelite.storage.transaction import Tx
from tests.storage.helpers import NOW, RULES, new_key_hash, pop_request, text_request
from tests.views import worker_view

WORKER = worker_view(
    id=str(uuid.uuid4()),
    models=("m1",),
    nsfw=True,
)


def _candidate_sql(conn: Tx, skip_locked: bool) -> str:
    query = pop._candidate_query(WORKER, "m1", skip_locked)
    return str(query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))


def _fill_queue(conn: Tx, other_model: int, own_model: int) -> None:
    """Waiting requests, one queue row each: ``other_model`` for "other", then ``own_model`` for "m1"."""
    conn.execute(insert(users).values(id=1, username="flood", key_hash=new_key_hash(), created=NOW))
    request_rows: list[dict[str, Any]] = []
    queue_rows: list[dict[str, Any]] = []
    for i in range(other_model + own_model):
        model = "other" if i < other_model else "m1"
        request_id = str(uuid.uuid4())
        common = {"user_id": 1, "anonymous": False, "prio_key": float(-i), "created": NOW + i}
        common |= {"max_length": 80, "max_context_length": 2048, "nsfw": False}
        request_rows.append(
            {
                **common,
                "id": request_id,
                "state": "waiting",
                "prompt": "p",
                "params": {},
                "models": [model],
                "worker_ids": [],
                "n": 1,
                "remaining": 1,
                "priority": 0.0,
                "expires": NOW + 10_000,
            }
        )
        queue_rows.append(
            {
                **common,
                "request_id": request_id,
                "model": model,
                "trusted_only": False,
                "fast_only": False,
                "worker_filter": 0,
            }
        )
    conn.execute(insert(requests), request_rows)
    conn.execute(insert(queue), queue_rows)


def test_the_sqlite_candidate_query_walks_ix_queue_order_without_sorting(
    sqlite_database: Database,
) -> None:
    def plan(conn: Tx) -> list[str]:
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + _candidate_sql(conn, False)).all()
        return [row[3] for row in rows]

    details = sqlite_database.run_sync(plan, False)

    assert any(d.startswith("SEARCH queue USING INDEX ix_queue_order (model=?") for d in details), (
        details
    )
    assert not any("TEMP B-TREE" in d for d in details), details
    assert not any(d.startswith("SCAN queue") for d in details), details


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_the_postgresql_candidate_query_reads_only_the_worker_model_rows_in_index_order(
    postgresql_database: Database,
) -> None:
    db = postgresql_database
    db.run_sync(_fill_queue, True, 5000, 1)
    db.run_sync(lambda conn: conn.exec_driver_sql("ANALYZE"), True)

    def explain(conn: Tx) -> dict[str, Any]:
        sql = "EXPLAIN (ANALYZE, FORMAT JSON) " + _candidate_sql(conn, True)
        return conn.exec_driver_sql(sql).scalar_one()[0]["Plan"]  # type: ignore[no-any-return]

    # A write transaction: the skip-locked query takes its lock for real.
    nodes = list(_nodes(db.run_sync(explain, True)))

    on_queue = [n for n in nodes if n.get("Relation Name") == "queue"]
    assert [(n["Node Type"], n.get("Index Name")) for n in on_queue] == [
        ("Index Scan", "ix_queue_order")
    ]
    assert not [n["Node Type"] for n in nodes if "Sort" in n["Node Type"]]
    examined = on_queue[0]["Actual Rows"] + on_queue[0].get("Rows Removed by Filter", 0)
    assert examined <= 2, on_queue[0]


def test_a_pop_finds_its_model_job_behind_two_thousand_requests_for_another_model(
    database: Database,
) -> None:
    unlimited = dataclasses.replace(RULES, concurrency=0)
    flood, mine, poorer, owner = (new_key_hash() for _ in range(4))

    def seed(conn: Tx) -> str:
        for key_hash, name, kudos in [
            (flood, "flood", 1e6),
            (mine, "rich", 100),
            (poorer, "poor", 0),
        ]:
            queries.create_user(conn, name, key_hash, kudos, False, False, NOW)
        queries.create_user(conn, "owner", owner, 0, False, False, NOW)

        def submit(key_hash: str, model: str, now: float) -> str:
            request_id = str(uuid.uuid4())
            queries.submit_request(
                conn,
                key_hash,
                new_text_request(text_request(models=[model]), lambda req: 0.0),
                request_id,
                now,
                unlimited,
                512,
                "test:1:test",
            )
            return request_id

        # Older and richer than the m1 requests: first in the queue, but for another model.
        for i in range(2000):
            submit(flood, "other", NOW - 1000 + i * 0.01)
        submit(poorer, "m1", NOW)
        return submit(mine, "m1", NOW)

    best = database.run_sync(seed, True)

    result = database.run_sync(
        queries.pop_job,
        True,
        owner,
        pop_request("w1", ["m1"]),
        NOW + 1,
        unlimited,
        not database.is_sqlite,
    )

    assert result.job is not None
    assert result.job.request_id == best
    assert result.job.model == "m1"
