"""The pop's SQL eligibility filter and ``skip_reason`` state one rule: on
random worker declarations and requests, over SQLite and PostgreSQL, the
filter finds a queued request exactly when ``skip_reason`` finds no reason.

Each example queues one request (as ``submit_request`` stores it) and runs
the candidate query of every queue class the worker's declaration covers,
the way a pop does, in a transaction that is then rolled back. The slow-worker
preference (``capped``) is a preference between workers, not eligibility, and
is left out.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hordelite.contract.chat_features import ChatFeature
from hordelite.contract.eligibility import RequestView, WorkerView, skip_reason
from hordelite.storage import accounts, pop, queries
from hordelite.storage import requests as requests_store
from hordelite.storage.database import Database
from hordelite.storage.transaction import Tx
from tests.storage.helpers import ANONYMOUS_HASH, NOW, RULES, new_key_hash, pop_request

MODELS = ("m1", "m2", "m3")
FEATURES = [f for f in ChatFeature][:4]
MASKS = st.sets(st.sampled_from(FEATURES)).map(lambda fs: sum(f.value for f in fs))
LENGTHS = st.sampled_from([16, 64, 256, 1024])
CONTEXTS = st.sampled_from([256, 1024, 4096])
TEMPERATURES = st.none() | st.sampled_from([0.0, 0.5, 1.0])


class _Rollback(Exception):
    def __init__(self, found: bool) -> None:
        super().__init__("roll back the example")
        self.found = found


@st.composite
def workers(draw: st.DrawFn, ids: tuple[str, str]) -> WorkerView:
    chat_model = draw(st.none() | st.sampled_from(MODELS))
    speed_sample = draw(st.sampled_from([(0.0, 0.0), (10.0, 100.0), (100.0, 1.0)]))
    return WorkerView(
        id=draw(st.sampled_from(ids)),
        models=tuple(draw(st.sets(st.sampled_from(MODELS), min_size=1))),
        max_length=draw(LENGTHS),
        max_context_length=draw(CONTEXTS),
        nsfw=draw(st.booleans()),
        trusted=draw(st.booleans()),
        threads=1,
        extra_slow=draw(st.booleans()),
        maintenance=False,
        tokens_generated=speed_sample[0],
        seconds_generating=speed_sample[1],
        prompt_jobs=draw(st.booleans()) if chat_model else True,
        chat_model=chat_model,
        chat_mask=draw(MASKS) if chat_model else 0,
        chat_max_context_length=draw(CONTEXTS) if chat_model else 0,
        chat_max_length=draw(LENGTHS) if chat_model else 0,
        tools_max_temperature=draw(TEMPERATURES) if chat_model else None,
    )


@st.composite
def requests(draw: st.DrawFn, ids: tuple[str, str]) -> RequestView:
    kind = draw(st.sampled_from(["text", "chat"]))
    chat = kind == "chat"
    models = draw(st.sets(st.sampled_from(MODELS), min_size=1 if chat else 0))
    max_length = draw(LENGTHS)
    context_tokens = draw(st.sampled_from([0, 100, 1000])) if chat else 0
    return RequestView(
        models=tuple(sorted(models)),
        max_length=max_length,
        max_context_length=context_tokens + max_length if chat else draw(CONTEXTS),
        trusted_workers=draw(st.booleans()),
        slow_workers=draw(st.booleans()),
        nsfw=draw(st.booleans()),
        worker_ids=tuple(draw(st.sets(st.sampled_from(ids)))),
        worker_blacklist=draw(st.booleans()),
        kind=kind,
        features=draw(MASKS) if chat else 0,
        context_tokens=context_tokens,
        tools_temperature=draw(TEMPERATURES) if chat else None,
    )


def _queue(conn: Tx, view: RequestView) -> None:
    """Store the request as submit_request does (its eligibility fields are the view's)."""
    user = accounts.authenticate(conn, ANONYMOUS_HASH, RULES)
    new = queries.NewRequest(
        eligibility=view,
        prompt="p",
        params={},
        n=1,
        quote=0.0,
        chat={} if view.kind == "chat" else None,
    )
    intake = requests_store.Intake(str(uuid.uuid4()), "test")
    requests_store._store(conn, user, None, new, [], intake, NOW, RULES, 10**9)


def _sql_finds(conn: Tx, worker: WorkerView, view: RequestView) -> bool:
    """Queue the request, run the pop's candidate queries, then roll back
    (raising _Rollback with what they found)."""
    _queue(conn, view)
    # Every class walked, the any-model one too; owner -1 has none queued.
    walks = pop._Walks(pop._classes(conn, worker, any_model=True), (False,))
    found = pop._best_candidate(conn, worker, -1, False, set(), False, walks)
    raise _Rollback(found is not None)


@pytest.fixture
def worker_ids(database: Database) -> tuple[str, str]:
    """Two workers that exist (a request may name them)."""
    key_hash = new_key_hash()
    database.run_sync(queries.create_user, True, "owner", key_hash, 0.0, False, False, NOW)
    ids = []
    for name in ("w1", "w2"):
        result = database.run_sync(
            queries.pop_job, True, key_hash, pop_request(name, ["m1"]), NOW, RULES, False
        )
        ids.append(result.worker.id)
    return ids[0], ids[1]


def test_the_sql_filter_and_skip_reason_agree(
    database: Database, worker_ids: tuple[str, str]
) -> None:
    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(workers(worker_ids), requests(worker_ids))
    def agree(worker: WorkerView, view: RequestView) -> None:
        with pytest.raises(_Rollback) as outcome:
            database.run_sync(_sql_finds, True, worker, view)
        reason = skip_reason(worker, view)
        assert outcome.value.found == (reason is None), (reason, worker, view)

    agree()
