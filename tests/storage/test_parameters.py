"""No statement's parameters grow with the pool (decision 0048), on SQLite
and PostgreSQL: with 700 workers of 100 models online (70,000 served
models, more than the 65,535 parameters psycopg allows a statement), the
queue depth, the served models' page and a status read that counts every
online worker's busy threads each send statements of a few parameters."""

from __future__ import annotations

import pytest

from hordelite.storage import queries
from hordelite.storage.database import Database
from tests.storage.helpers import (
    FEW_PARAMETERS,
    NOW,
    POSTGRES_MAX_PARAMETERS,
    RULES,
    clone_workers,
    create_user,
    parameter_counts,
    pop,
    submit,
    text_request,
)
from tests.views import worker_view

pytestmark = pytest.mark.anyio

WORKERS = 700
MODELS = 100


@pytest.fixture
def anyio_backend() -> str:
    return "trio"  # the queries run in threads or inline alike: once is enough


def models_of(i: int) -> list[str]:
    return [f"model-{i:03d}-{j:02d}" for j in range(MODELS)]


async def test_reads_of_a_pool_of_70000_served_models_send_few_parameters(
    database: Database,
) -> None:
    assert WORKERS * MODELS > POSTGRES_MAX_PARAMETERS
    owner = await create_user(database, "owner")
    assert (await pop(database, owner, "worker-000", models_of(0))).job is None
    await database.write(
        clone_workers, "worker-000", {f"worker-{i:03d}": models_of(i) for i in range(1, WORKERS)}
    )
    requester = await create_user(database, "alice", kudos=1000)
    # Two requests for worker 5's models, one for worker 9's and a model nobody serves.
    for _ in range(2):
        await submit(database, requester, text_request(models=models_of(5)))
    mixed = await submit(database, requester, text_request(models=[*models_of(9)[:3], "nobody"]))
    unserved = await submit(database, requester, text_request(models=["nobody-at-all"]))
    # The pool as the horde's snapshot holds it: 70,000 online workers (a
    # status read counts the busy threads of each).
    pool = [
        worker_view(
            id=f"00000000-0000-0000-0000-{n:012d}",
            models=("model-009-00",),
        )
        for n in range(WORKERS * MODELS)
    ]
    with parameter_counts(database) as counts:
        depth = await database.read_aside(queries.queue_depth, NOW, 3)
        served = await database.read_aside(queries.served_models, NOW, 10, 0)
        status = await database.read(
            queries.request_status, mixed, "text", NOW, RULES, with_busy=True, pool=pool
        )
        assert (await database.read(queries.request_status, unserved, "text", NOW, RULES)).request
    # Without arrays.one_of and the served models read in the statement, the
    # queue depth was bound with 70,001 parameters and _busy with 70,000.
    assert counts, "no statement was sent"
    assert max(counts) <= FEW_PARAMETERS, max(counts)
    # And what they answer is right.
    assert depth.models == {(m, "text"): 2 for m in models_of(5)[:3]}
    assert depth.other == {"text": 2 * MODELS - 2 * 3 + 3}
    assert depth.unserved == {"text": 1}
    assert served.total == WORKERS * MODELS
    assert [m.name for m in served.models] == sorted(
        f"model-{i:03d}-{j:02d}" for i in range(WORKERS) for j in range(MODELS)
    )[:10]
    assert status.busy == {}
