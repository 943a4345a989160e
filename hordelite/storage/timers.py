"""The sweep: expired leases and requests, purged history, idle queue classes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    bindparam,
    case,
    delete,
    exists,
    func,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.sql import Select

from hordelite.contract import faults
from hordelite.storage import addresses, audit
from hordelite.storage.accounts import purge_transfer_keys
from hordelite.storage.activity import roll_up
from hordelite.storage.arrays import by_codepoint
from hordelite.storage.ledger import charge_worker, lapse_job
from hordelite.storage.messages import purge_messages
from hordelite.storage.pool import served_model_names
from hordelite.storage.queueing import HELD, count_generations, end_request, release
from hordelite.storage.requests import forget_refusals
from hordelite.storage.rules import Rules
from hordelite.storage.schema import (
    ANY_MODEL,
    jobs,
    queue,
    queue_classes,
    request_workers,
    requests,
)
from hordelite.storage.stats import roll_up_days
from hordelite.storage.transaction import Tx, prepared

CLASS_IDLE_SECONDS = 3600.0

# The PostgreSQL advisory lock a sweep runs under, so that of several
# processes serving one horde at most one sweeps at a time (the others skip
# that round). Its first key; the second is the hash of the schema, so that
# hordes in other schemas of the same database never wait on each other.
SWEEP_LOCK_KEY = 0x686C7377  # "hlsw"


@dataclasses.dataclass(frozen=True)
class SweepResult:
    expired_jobs: int
    requeued: int
    ended_requests: list[str]
    purged_requests: int
    expired_job_ids: list[str] = dataclasses.field(default_factory=list)
    # Requests whose status changed or that are gone (their statuses are stale).
    changed_requests: list[str] = dataclasses.field(default_factory=list)
    # Requests deleted past their retention (their blobs go too).
    purged_ids: list[str] = dataclasses.field(default_factory=list)
    # Ended requests whose content was released, and which of them held
    # images (their blobs go now).
    released: int = 0
    released_image_ids: list[str] = dataclasses.field(default_factory=list)
    # Another process was sweeping (PostgreSQL): this round did nothing.
    skipped: bool = False


def sweep(
    conn: Tx,
    now: float,
    rules: Rules,
    extended: dict[str, float] | None = None,
    *,
    wait: bool = False,
) -> SweepResult:
    """Expire leases and requests, purge ended requests past retention.

    ``extended`` holds the progress leases of streamed jobs: a job whose
    progress lease still runs has its stored lease moved to that end instead.

    On PostgreSQL the sweep first takes the sweep lock for its transaction:
    when another transaction holds it, the sweep returns at once with
    ``skipped`` set, or with ``wait`` waits for it and then sweeps.
    """
    if not _sweep_lock(conn, wait):
        return SweepResult(0, 0, [], 0, skipped=True)
    expired, requeued, ended = _expire_leases(conn, now, rules, extended or {})
    ended += _expire_requests(conn, now)
    purged = _purge(conn, now - rules.retention, now)
    purge_messages(conn, now - rules.retention)
    forget_refusals(conn, now)
    purge_transfer_keys(conn, now - rules.retention)
    audit.purge(conn, now - rules.audit_retention)
    addresses.purge(conn, now, rules.offences.memory)
    released, with_images = _release_ended(conn)
    _drop_idle_classes(conn, now)
    # Every request of an expired job changed (requeued or ended), and a
    # purged one is gone: their cached statuses must not answer.
    changed = list(dict.fromkeys([*(j["request_id"] for j in expired), *ended, *purged]))
    return SweepResult(
        len(expired),
        requeued,
        ended,
        len(purged),
        [j["id"] for j in expired],
        changed,
        purged_ids=purged,
        released=released,
        released_image_ids=with_images,
    )


def _expire_leases(
    conn: Tx, now: float, rules: Rules, extended: dict[str, float]
) -> tuple[list[Mapping[str, Any]], int, list[str]]:
    """Give back the jobs whose lease ran out (a streamed job whose progress
    lease still runs has its stored lease moved to that end instead): the
    expired jobs, how many were requeued, and the requests that ended."""
    expired = (
        conn.execute(
            select(jobs)
            .where(jobs.c.state == "processing", jobs.c.lease_expires < now)
            .with_for_update(skip_locked=True)
        )
        .mappings()
        .all()
    )
    for job in [j for j in expired if extended.get(j["id"], 0) >= now]:
        conn.execute(
            update(jobs).where(jobs.c.id == job["id"]).values(lease_expires=extended[job["id"]])
        )
    expired = [j for j in expired if extended.get(j["id"], 0) < now]
    requeued = 0
    ended: list[str] = []
    for job in expired:
        # Locks in the order submits take them: job, request, worker.
        was_requeued, was_ended = lapse_job(conn, job, now, rules)
        charge_worker(conn, job["worker_id"], faults.LEASE_EXPIRY.charge, now, rules)
        requeued += was_requeued
        if was_ended:
            ended.append(job["request_id"])
    return list(expired), requeued, ended


def _expire_requests(conn: Tx, now: float) -> list[str]:
    """End the waiting requests past their expiry; the ids. A request past its
    expiry with a job still out waits for that job."""
    busy = exists().where(jobs.c.request_id == requests.c.id, jobs.c.state == "processing")
    stale = conn.execute(
        select(requests.c.id).where(requests.c.state == "waiting", requests.c.expires < now, ~busy)
    ).scalars()
    ended = stale.all()
    for request_id in ended:
        end_request(conn, request_id, "expired", now)
    return list(ended)


def _sweep_lock(conn: Tx, wait: bool) -> bool:
    """The sweep lock for this transaction (released at its end); False when
    another transaction holds it and ``wait`` is not set. SQLite needs none:
    its write transactions already run one at a time."""
    if conn.dialect.name != "postgresql":
        return True
    schema = func.hashtext(func.current_schema())
    if wait:
        conn.execute(select(func.pg_advisory_xact_lock(SWEEP_LOCK_KEY, schema)))
        return True
    return bool(
        conn.execute(select(func.pg_try_advisory_xact_lock(SWEEP_LOCK_KEY, schema))).scalar()
    )


def _drop_idle_classes(conn: Tx, now: float) -> None:
    """Forget queue classes idle for an hour and empty, so chat pops stop visiting them."""
    rows = exists().where(
        queue.c.model == queue_classes.c.model,
        queue.c.kind == queue_classes.c.kind,
        queue.c.features == queue_classes.c.features,
    )
    conn.execute(
        delete(queue_classes).where(queue_classes.c.last_used < now - CLASS_IDLE_SECONDS, ~rows)
    )


def _purge(conn: Tx, before: float, now: float) -> list[str]:
    """Delete the requests that ended before ``before``; returns their ids.

    Their done jobs go to the dashboard's per-minute rollup first, in this
    transaction: the figures of the deleted rows as the deletes return them,
    so a job is rolled up exactly when it is deleted."""
    # A request whose webhook call is still owed stays until it is made or
    # given up (a horde down past the retention still calls it).
    ended_before = (requests.c.ended < before) & requests.c.hook_due.is_(None)
    old = select(requests.c.id).where(ended_before)
    purged_jobs = conn.execute(
        delete(jobs)
        .where(jobs.c.request_id.in_(old))
        .returning(jobs.c.request_id, jobs.c.state, jobs.c.submitted, jobs.c.tokens, jobs.c.model)
    ).all()
    conn.execute(delete(request_workers).where(request_workers.c.request_id.in_(old)))
    purged = conn.execute(
        delete(requests)
        .where(ended_before)
        .returning(
            requests.c.id,
            requests.c.created,
            requests.c.user_id,
            requests.c.generation_bytes,
            requests.c.held_bytes,
            requests.c.client,
        )
    ).all()
    # Their generations no longer held: off their users' (and addresses')
    # stored bytes, those of the released requests, which counted them.
    released = [r for r in purged if not r.held_bytes]
    count_generations(conn, [(r.user_id, r.generation_bytes, r.client) for r in released], -1)
    roll_up(conn, [r[:4] for r in purged_jobs], {r.id: r.created for r in purged}, now)
    # And to the daily figures of /stats/text, kept for ever.
    roll_up_days(conn, [(r.state, r.submitted, r.tokens, r.model) for r in purged_jobs])
    return [r.id for r in purged]


# Ended requests released per sweep at most: a burst of ends is released
# over a few sweeps, each transaction staying short.
RELEASE_BATCH = 1000

_ENDED_HELD = prepared(
    select(requests.c.id, requests.c.image_bytes)
    .where(requests.c.held_bytes > HELD, requests.c.ended.is_not(None))
    .limit(RELEASE_BATCH)
)
_STILL_OUT = select(jobs.c.request_id).where(
    jobs.c.request_id.in_(bindparam("ids", expanding=True)), jobs.c.state == "processing"
)


def _release_ended(conn: Tx) -> tuple[int, list[str]]:
    """Release the ended requests whose jobs are all back (done, or ended
    with jobs still out when they ended), read along ix_requests_held_ended
    and ix_jobs_request_id; returns how many, and the ids of those that held
    images."""
    rows = conn.execute(_ENDED_HELD).all()
    if not rows:
        return 0, []
    out = set(conn.execute(_STILL_OUT, {"ids": [r.id for r in rows]}).scalars())
    done = [r for r in rows if r.id not in out]
    release(conn, [r.id for r in done])
    return len(done), [r.id for r in done if r.image_bytes]


@dataclasses.dataclass(frozen=True)
class QueueDepth:
    """The jobs waiting for a worker (the metrics scrape), by kind: for the
    served models with most of them (at most the ``top`` asked for), summed
    for the other served models (a request for several counts under each,
    as it would under their own labels), for the requests that accept any
    model, and for the requests none of whose models is served (each counted
    once)."""

    models: dict[tuple[str, str], int]  # (model, kind)
    other: dict[str, int]
    any_model: dict[str, int]
    unserved: dict[str, int]


def queue_depth(conn: Tx, now: float, top: int) -> QueueDepth:
    """The queue's depth (``QueueDepth``) against the models the workers
    online at ``now`` list, in three statements whose parameters do not grow
    with the pool: the served models are read in the statements
    (``served_model_names``), never sent, and only the ``top`` models' rows
    come back. Clients name models freely, so only served ones are labels."""
    served = served_model_names(conn, now)
    waiting = func.coalesce(func.sum(requests.c.remaining), 0)
    joined = queue.join(requests, requests.c.id == queue.c.request_id)
    # One pass over the served part of the queue, grouped once (both
    # databases keep a CTE that is read twice rather than run it twice):
    # the top models' rows, then the totals by kind (model NULL).
    per = (
        select(queue.c.model, queue.c.kind, waiting.label("jobs"))
        .select_from(joined)
        .where(queue.c.model.in_(served))
        .group_by(queue.c.model, queue.c.kind)
        .cte("per_model")
    )
    ranked = (
        select(per.c.model)
        .group_by(per.c.model)
        .order_by(func.sum(per.c.jobs).desc(), by_codepoint(conn, per.c.model))
        .limit(top)
    )
    rows = conn.execute(
        union_all(
            select(per.c.model, per.c.kind, per.c.jobs).where(per.c.model.in_(ranked)),
            select(null().label("model"), per.c.kind, func.sum(per.c.jobs)).group_by(per.c.kind),
        )
    ).all()
    models = {(m, kind): int(count) for m, kind, count in rows if m is not None}
    other = {kind: int(count) for m, kind, count in rows if m is None}
    for (_, kind), count in models.items():
        other[kind] -= count
    any_model = conn.execute(
        select(queue.c.kind, waiting)
        .select_from(joined)
        .where(queue.c.model == ANY_MODEL)
        .group_by(queue.c.kind)
    ).all()
    return QueueDepth(
        models,
        {kind: count for kind, count in other.items() if count},
        {kind: int(count) for kind, count in any_model},
        _unserved(conn, served),
    )


def _unserved(conn: Tx, served: Select[tuple[str]]) -> dict[str, int]:
    """Per kind: the jobs of the requests none of whose models is served (nor
    any model), each request counted once."""
    reachable = func.sum(
        case((or_(queue.c.model == ANY_MODEL, queue.c.model.in_(served)), 1), else_=0)
    )
    waiting = (
        select(queue.c.request_id, queue.c.kind)
        .group_by(queue.c.request_id, queue.c.kind)
        .having(reachable == 0)
        .subquery()
    )
    rows = conn.execute(
        select(waiting.c.kind, func.coalesce(func.sum(requests.c.remaining), 0))
        .join(requests, requests.c.id == waiting.c.request_id)
        .group_by(waiting.c.kind)
    ).all()
    return {kind: int(jobs) for kind, jobs in rows}
