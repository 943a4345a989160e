"""Small builders shared by the storage tests: users, bodies, and the calls
the service makes, with explicit times."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import event, insert, select

from hordelite.contract.text import (
    JobSubmit,
    PopRequest,
    TextRequest,
    parse_job_submit,
    parse_pop_request,
    parse_text_request,
)
from hordelite.contract.unicode_rules import worker_name_key
from hordelite.horde.service import new_text_request
from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.schema import activity_minutes, workers
from hordelite.storage.transaction import Tx

NOW = 1_000_000.0
ANONYMOUS_HASH = hashlib.sha256(b"0000000000").hexdigest()

RULES = queries.Rules(
    job_ttl=150.0,
    request_expiry=1200.0,
    retention=1800.0,
    worker_online=300.0,
    max_faults=2,
    maintenance_aborts=20,
    concurrency=30,
    anonymous_concurrency=100,
    allow_anonymous=True,
    # No registration cap: the storage suites register workers freely
    # (test_pop_registration.py sets one).
    workers_per_user=0,
    trusted_workers_per_user=0,
)

# What submit_job is told a model is worth, in billions of parameters.
MODEL_BILLIONS = 7.0


def billions(model: str) -> float:
    return MODEL_BILLIONS


def new_key_hash() -> str:
    return hashlib.sha256(secrets.token_bytes(16)).hexdigest()


async def create_user(db: Database, name: str, kudos: float = 0.0, now: float = NOW) -> str:
    """A new user; returns its key hash (what the queries take)."""
    key_hash = new_key_hash()
    await db.write(queries.create_user, name, key_hash, kudos, False, False, now)
    return key_hash


async def requester_and_owner(db: Database, kudos: float = 0.0) -> tuple[str, str]:
    """A requester, alice, with ``kudos``, and a workers' owner, bob: their
    key hashes."""
    return await create_user(db, "alice", kudos), await create_user(db, "bob")


def text_request(prompt: str = "Once upon a time", **body: Any) -> TextRequest:
    params = body.pop("params", {"max_length": 80})
    return parse_text_request({"prompt": prompt, "params": params, **body})


def pop_request(name: str, models: list[str], **body: Any) -> PopRequest:
    # No models cap: it is applied at parse, before storage (tests/unit).
    return parse_pop_request(
        {"name": name, "models": models, **body}, max_wait=60, models_per_worker=0
    )


def job_submit(job_id: str, generation: str, state: str = "ok") -> JobSubmit:
    return parse_job_submit({"id": job_id, "generation": generation, "state": state, "seed": 1})


def _quote(req: TextRequest) -> float:
    return 0.0


async def submit(db: Database, key_hash: str, req: TextRequest, now: float = NOW) -> str:
    """Queue ``req``; returns the new request's id."""
    request_id = str(uuid.uuid4())
    await db.write(
        queries.submit_request,
        key_hash,
        new_text_request(req, _quote),
        request_id,
        now,
        RULES,
        512,
        "test:1:test",
    )
    return request_id


async def pop(
    db: Database, key_hash: str, name: str, models: list[str], now: float = NOW, **body: Any
) -> queries.PopResult:
    """One pop, as the service runs it (skip-locked on PostgreSQL)."""
    return await db.write(
        queries.pop_job,
        key_hash,
        pop_request(name, models, **body),
        now,
        RULES,
        not db.is_sqlite,
    )


async def status(db: Database, request_id: str, now: float = NOW) -> queries.StatusSnapshot:
    return await db.read(queries.request_status, request_id, "text", now, RULES)


def activity_rows(conn: Tx) -> list[tuple[int, int, int, float]]:
    """The activity roll-up, a (minute, jobs, tokens, latency sum) row a minute."""
    rows = conn.execute(select(activity_minutes).order_by(activity_minutes.c.minute)).all()
    return [(int(m), int(n), int(t), float(s)) for m, n, t, s in rows]


def clone_workers(conn: Tx, template: str, clones: dict[str, list[str]]) -> None:
    """Copies of the worker named ``template`` (checked in by a real pop),
    one per name of ``clones``, each declaring its models: a pool of
    hundreds of workers in one statement, where as many pops would take the
    test seconds. Each copy is online as long as the template."""
    row = dict(conn.execute(select(workers).where(workers.c.name == template)).mappings().one())
    conn.execute(
        insert(workers),
        [
            {
                **row,
                "id": str(uuid.uuid4()),
                "name": name,
                "name_key": worker_name_key(name),
                "models": models,
            }
            for name, models in clones.items()
        ],
    )


# What psycopg allows one statement (PostgreSQL's protocol counts them in
# 16 bits), and what a statement whose parameters do not grow with the pool
# needs at most (decision 0048).
POSTGRES_MAX_PARAMETERS = 65_535
FEW_PARAMETERS = 16


@contextlib.contextmanager
def _listening(db: Database, listener: Callable[..., None]) -> Iterator[None]:
    """``listener`` hears every statement ``db`` sends while the block runs
    (SQLAlchemy's ``before_cursor_execute``, the prepared statements of Tx's
    fast path included), on its pool's engine and, on SQLite, the engine of
    what it runs inline."""
    found = {id(e): e for e in (db.engine, getattr(db, "_inline_engine", None)) if e}
    for engine in found.values():
        event.listen(engine, "before_cursor_execute", listener)
    try:
        yield
    finally:
        for engine in found.values():
            event.remove(engine, "before_cursor_execute", listener)


@contextlib.contextmanager
def heard_statements(db: Database) -> Iterator[list[str]]:
    """Every SQL statement ``db`` sends while the block runs."""
    heard: list[str] = []

    def listen(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        heard.append(statement)

    with _listening(db, listen):
        yield heard


@contextlib.contextmanager
def parameter_counts(db: Database) -> Iterator[list[int]]:
    """How many parameters each statement ``db`` sends while the block runs
    is bound with (for an executemany, its largest row); an array counts as
    one, as the driver sends it."""
    counts: list[int] = []

    def count(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        rows = params if many else [params]
        counts.append(max((len(row) for row in rows if row is not None), default=0))

    with _listening(db, count):
        yield counts
