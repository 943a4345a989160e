"""A worker's pop: check it in, find the best job it may take, hand it out."""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    exists,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.sql import Select

from hordelite.contract.chat_features import (
    IMAGE_TRANSPORT_BITS,
    ChatFeature,
    ChatGuarantee,
)
from hordelite.contract.eligibility import (
    REQUEST_FIELDS,
    RequestView,
    WorkerView,
    may_be_passed_over,
    passed_over,
    preferred_tokens,
)
from hordelite.contract.limits import (
    SKIPPED_SAMPLE,
)
from hordelite.contract.presence import online_until
from hordelite.contract.text import PopRequest
from hordelite.storage import suspicion
from hordelite.storage.addresses import note_worker_address
from hordelite.storage.pool import (
    declaration_changed,
    hold_worker_cap,
    online_now,
    popper,
    register_worker,
    stored_declaration,
    touch_worker,
    worker_view,
)
from hordelite.storage.queueing import dequeue
from hordelite.storage.rules import Rules
from hordelite.storage.schema import (
    ANY_MODEL,
    jobs,
    queue,
    queue_classes,
    request_workers,
    requests,
    workers,
)
from hordelite.storage.transaction import Tx, prepared

_ALL_FEATURE_BITS = (
    sum(f.value for f in ChatFeature)
    | sum(g.value for g in ChatGuarantee)
    | sum(IMAGE_TRANSPORT_BITS.values())
)

_INSERT_JOB = prepared(insert(jobs))

# The chat classes of a model whose required features a declaration covers.
_CHAT_CLASSES = prepared(
    select(queue_classes.c.features).where(
        queue_classes.c.model == bindparam("model"),
        queue_classes.c.kind == "chat",
        queue_classes.c.features.op("&")(bindparam("undeclared")) == 0,
    )
)

# The best waiting requests, with only what eligibility reads (not their
# prompts or conversations).
_SKIPPED_SAMPLE = prepared(
    select(*(requests.c[name] for name in REQUEST_FIELDS))
    .where(requests.c.state == "waiting", requests.c.remaining > 0)
    .order_by(requests.c.state, requests.c.anonymous, requests.c.prio_key.desc())
    .limit(SKIPPED_SAMPLE)
)

_CLAIM = prepared(
    update(requests)
    .where(
        requests.c.id == bindparam("rid"), requests.c.state == "waiting", requests.c.remaining > 0
    )
    .values(remaining=requests.c.remaining - 1, expires=bindparam("expires"))
    .returning(
        requests.c.remaining,
        requests.c.prompt,
        requests.c.params,
        requests.c.softprompt,
        requests.c.chat,
        requests.c.max_length,
        requests.c.max_context_length,
        requests.c.restarts,
    )
)


@dataclasses.dataclass(frozen=True)
class PoppedJob:
    """A job handed out, with what its payload is made of: a text job's
    payload is its stored params and prompt; a chat job's is built by the
    horde, after the transaction, from ``request`` (the stored chat request)
    and the budgets of the declaration it was assigned under."""

    id: str
    request_id: str
    model: str
    payload: dict[str, Any]  # a text job's; empty for a chat job
    softprompt: str | None
    ttl: float
    chat: bool = False
    gen: int = 0  # the attempt of the request (its restarts so far)
    max_length: int = 0
    max_context_length: int = 0
    request: dict[str, Any] | None = None  # a chat job's stored request


@dataclasses.dataclass(frozen=True)
class PopResult:
    worker: WorkerView
    job: PoppedJob | None
    # The worker joined the pool, came back to it, or declared something new.
    pool_changed: bool = False


def pop_job(
    conn: Tx,
    key_hash: str,
    pop: PopRequest,
    now: float,
    rules: Rules,
    skip_locked: bool | None = None,
    poll_left: float | None = None,
    address: str | None = None,
) -> PopResult:
    """Check the worker in and hand it the best job it may take, if any.

    ``skip_locked``: whether the claim skips requests other pops hold
    locked; None (the default) leaves it to the database: PostgreSQL skips
    them, SQLite (one writer at a time, no row locks) has none to skip.
    ``poll_left``: seconds this long-polled pop still waits after this
    attempt (None: it does not long-poll); how long the check-in lasts
    depends on it (hordelite.contract.presence). What the worker skipped is
    counted by the service after the transaction, and only for a pop that
    hands out nothing (``skipped_sample``). ``address``: where the pop came
    from, kept on the worker (a moderator may block it)."""
    if skip_locked is None:
        skip_locked = conn.dialect.name == "postgresql"
    found = popper(conn, key_hash, pop, rules)
    user, row = found.user, found.worker
    declared = stored_declaration(pop, now)
    fresh = row is None
    if row is None:
        # First pop: the worker exists (and is online) from this transaction.
        row = register_worker(conn, user, pop, declared, now, rules)
        words = rules.suspicious_name_words
        suspicion.judge_name(conn, row["id"], pop.name, user["trusted"], words, now)
    note_worker_address(conn, row["id"], row.get("address"), address)
    pool_changed = fresh or row["online_until"] <= now or declaration_changed(row, declared)
    worker = worker_view({**row, **declared, "trusted": user["trusted"]})
    # A paused worker checks in and is handed nothing (the AI Horde's pause);
    # so does one registered in the maintenance a deleted worker of its name
    # left (pool.take_hold): its next pop is refused as in maintenance.
    job = None
    if not (row["paused"] or row["maintenance"]):
        classes = _classes(conn, worker, found.any_model_queued)
        walks = _Walks(classes, (True, False) if found.owns_queued else (False,))
        job = _claim(conn, worker, user["id"], now, rules, skip_locked, walks)
    if fresh:
        # A worker already registered is never refused by the cap, even one
        # lowered since: only the pop that registers one counts.
        hold_worker_cap(conn, user, pop.name, rules)
    until = online_until(
        now,
        handed_job=job is not None,
        poll_left=poll_left,
        wait=pop.wait,
        worker_online=rules.worker_online,
    )
    if not fresh:
        touch_worker(conn, row, declared, now, rules, until)
    elif until != row["online_until"]:
        conn.execute(update(workers).where(workers.c.id == row["id"]).values(online_until=until))
    return PopResult(worker, job, pool_changed)


@functools.lru_cache(maxsize=128)
def _candidate_statement(
    kind: str,
    trusted: bool,
    slow: bool,
    nsfw: bool,
    skip_locked: bool,
    own: bool,
    tools_limit: bool = False,
    capped: bool = False,
) -> Select[Any]:
    """The best queue row of one (model, kind, features) class a worker of
    this kind may take.

    Built once per combination of flags; ``model``, ``features``,
    ``max_length``, ``max_context_length``, ``worker_id`` (``owner_id``
    when ``own``, ``tools_max_temperature`` when ``tools_limit``) are bound
    at execution. The three equalities are the prefix of ix_queue_order, so
    the walk reads the class in priority order and stops at the first row
    the worker can take.
    """
    listed = exists().where(
        request_workers.c.request_id == queue.c.request_id,
        request_workers.c.worker_id == bindparam("worker_id"),
    )
    q: Select[Any] = select(
        queue.c.request_id, queue.c.model, queue.c.anonymous, queue.c.prio_key, queue.c.created
    ).where(
        queue.c.model == bindparam("model"),
        queue.c.kind == kind,
        queue.c.features == bindparam("features"),
        or_(
            queue.c.worker_filter == 0,
            and_(queue.c.worker_filter == 1, listed),
            and_(queue.c.worker_filter == 2, ~listed),
        ),
    )
    if kind == "text":
        q = q.where(
            queue.c.max_length <= bindparam("max_length"),
            queue.c.max_context_length <= bindparam("max_context_length"),
        )
    else:
        q = _chat_limits(q, capped, tools_limit)
    if not trusted:
        q = q.where(queue.c.trusted_only.is_(False))
    if slow:
        q = q.where(queue.c.fast_only.is_(False))
    if not nsfw:
        q = q.where(queue.c.nsfw.is_(False))
    if own:
        q = q.where(queue.c.user_id == bindparam("owner_id"))
    if skip_locked:
        # Lock the request, not the queue row: a request has a row per model,
        # and the request row is the one a claim updates.
        q = q.join(requests, requests.c.id == queue.c.request_id).with_for_update(
            of=requests, skip_locked=True
        )
    return prepared(
        q.order_by(queue.c.anonymous, queue.c.prio_key.desc(), queue.c.created).limit(1)
    )


def _chat_limits(q: Select[Any], capped: bool, tools_limit: bool) -> Select[Any]:
    """A chat worker's limits: its reply length, and the conversation's
    estimate plus the reply within its context; for a slow worker
    (``capped``) and one with a tools temperature limit, those too."""
    q = q.where(
        queue.c.max_length <= bindparam("max_length"),
        queue.c.context_tokens + queue.c.max_length <= bindparam("max_context_length"),
    )
    if capped:
        # A slow worker, while a faster one serves the model: only what
        # it generates within the job lease preference (``slow_cap``).
        # Requests naming their workers are exempt: only they may serve them.
        q = q.where(or_(queue.c.max_length <= bindparam("slow_cap"), queue.c.worker_filter == 1))
    if tools_limit:
        q = q.where(
            or_(
                queue.c.tools_temperature.is_(None),
                queue.c.tools_temperature <= bindparam("tools_max_temperature"),
            )
        )
    return q


@dataclasses.dataclass(frozen=True)
class _Class:
    """One walk of the queue: a model, a kind and a required feature set."""

    kind: str
    model: str
    features: int


def _classes(conn: Tx, worker: WorkerView, any_model: bool) -> list[_Class]:
    """The queue classes this worker's declaration covers; the text class of
    requests naming no model only when one is queued (``any_model``, read
    by pool.popper in the pop's first statement: one queued since is the
    next pop's, as if it had come a moment later; its queue signal wakes
    that pop)."""
    classes = []
    if worker.prompt_jobs:
        models = [*worker.models, ANY_MODEL] if any_model else worker.models
        classes += [_Class("text", m, 0) for m in models]
    if worker.chat_model is not None:
        undeclared = ~worker.chat_mask & _ALL_FEATURE_BITS
        rows = conn.execute(_CHAT_CLASSES, {"model": worker.chat_model, "undeclared": undeclared})
        classes += [_Class("chat", worker.chat_model, f) for f in rows.scalars()]
    return classes


def _candidate_params(worker: WorkerView, cls: _Class, owner_id: int) -> dict[str, Any]:
    chat = cls.kind == "chat"
    return {
        "slow_cap": preferred_tokens(worker),
        "model": cls.model,
        "features": cls.features,
        "max_length": worker.chat_max_length if chat else worker.max_length,
        "max_context_length": worker.chat_max_context_length if chat else worker.max_context_length,
        "worker_id": worker.id,
        "owner_id": owner_id,
        "tools_max_temperature": worker.tools_max_temperature,
    }


def _statement_for(
    worker: WorkerView, cls: _Class, skip_locked: bool, own: bool, capped: bool = False
) -> Select[Any]:
    tools_limit = cls.kind == "chat" and worker.tools_max_temperature is not None
    return _candidate_statement(
        cls.kind,
        worker.trusted,
        worker.slow,
        worker.nsfw,
        skip_locked,
        own,
        tools_limit,
        capped and cls.kind == "chat",
    )


def _slower_than_another(conn: Tx, worker: WorkerView, now: float) -> bool:
    """Whether this chat worker's jobs are capped (eligibility.passed_over).
    Fast workers (the usual case) cost no query."""
    model = worker.chat_model
    if model is None or not may_be_passed_over(worker):
        return False
    chat_peers = online_now(conn, now, chat=True, models=[model])
    return passed_over(worker, chat_peers)


def _candidate_query(worker: WorkerView, model: str, skip_locked: bool) -> Select[Any]:
    """The text candidate query with this worker's values bound (for inspection)."""
    cls = _Class("text", model, 0)
    params = _candidate_params(worker, cls, 0)
    del params["owner_id"], params["tools_max_temperature"]
    return _statement_for(worker, cls, skip_locked, False).params(**params)


@dataclasses.dataclass(frozen=True)
class _Walks:
    """What a pop's candidate queries walk: the classes the worker's
    declaration covers, and whether its owner's own requests come first.
    Read once per pop: its retries and its look without the lock walk the same."""

    classes: list[_Class]
    # (True, False) when the owner has requests queued: its own come first.
    # Most owners have none (pool.popper reads which).
    owns: tuple[bool, ...]


def _best_candidate(
    conn: Tx,
    worker: WorkerView,
    owner_id: int,
    skip_locked: bool,
    exclude: set[str],
    capped: bool,
    walks: _Walks,
) -> dict[str, Any] | None:
    """The best queue row this worker may take."""
    candidates: list[dict[str, Any]] = []
    for cls in walks.classes:
        params = _candidate_params(worker, cls, owner_id)
        for own in walks.owns:
            stmt = _statement_for(worker, cls, skip_locked, own, capped)
            if exclude:
                stmt = stmt.where(queue.c.request_id.not_in(exclude))
            row = conn.execute(stmt, params).mappings().first()
            if row is not None:
                candidates.append({**row, "own": 0 if own else 1, "kind": cls.kind})
                break
    if not candidates:
        return None
    return min(candidates, key=lambda r: (r["own"], r["anonymous"], -r["prio_key"], r["created"]))


def _claim(
    conn: Tx,
    worker: WorkerView,
    owner_id: int,
    now: float,
    rules: Rules,
    skip_locked: bool,
    walks: _Walks,
) -> PoppedJob | None:
    exclude: set[str] = set()
    capped = _slower_than_another(conn, worker, now)
    for _ in range(4):
        cand = _best_candidate(conn, worker, owner_id, skip_locked, exclude, capped, walks)
        if cand is None and skip_locked:
            # Skipping passed over requests that other pops hold locked. A
            # request with n > 1 may still have jobs once their claim commits:
            # look again without the lock; the conditional update below then
            # waits for that claim instead of answering "no job".
            cand = _best_candidate(conn, worker, owner_id, False, exclude, capped, walks)
        if cand is None:
            return None
        claimed = (
            conn.execute(_CLAIM, {"rid": cand["request_id"], "expires": now + rules.request_expiry})
            .mappings()
            .first()
        )
        if claimed is None:
            exclude.add(cand["request_id"])
            continue
        if claimed["remaining"] == 0:
            dequeue(conn, cand["request_id"])
        return _assign(conn, worker, owner_id, cand, claimed, now, rules)
    return None


def _assign(
    conn: Tx,
    worker: WorkerView,
    owner_id: int,
    cand: dict[str, Any],
    claimed: Mapping[str, Any],
    now: float,
    rules: Rules,
) -> PoppedJob:
    """The job row and the payload the worker receives.

    A chat job records the model and the budgets of the declaration it was
    assigned under, so a later change of declaration does not change it.
    """
    chat = cand["kind"] == "chat"
    model = cand["model"] or worker.models[0]
    max_length = claimed["max_length"]
    max_context_length = worker.chat_max_context_length if chat else claimed["max_context_length"]
    job_id = str(uuid.uuid4())
    conn.defer(
        _INSERT_JOB,
        {
            "id": job_id,
            "request_id": cand["request_id"],
            "worker_id": worker.id,
            "owner_id": owner_id,
            "model": model,
            "state": "processing",
            "started": now,
            "lease_expires": now + rules.job_ttl,
            "kind": cand["kind"],
            "max_length": max_length,
            "max_context_length": max_context_length,
        },
    )
    return PoppedJob(
        job_id,
        cand["request_id"],
        model,
        {} if chat else {**claimed["params"], "prompt": claimed["prompt"], "n": 1},
        claimed["softprompt"],
        rules.job_ttl,
        chat,
        claimed["restarts"],
        max_length,
        max_context_length,
        claimed["chat"] if chat else None,
    )


def skipped_sample(conn: Tx) -> list[RequestView]:
    """The best waiting requests (SKIPPED_SAMPLE of them), as eligibility sees them."""
    return [RequestView.of(row) for row in conn.execute(_SKIPPED_SAMPLE).mappings()]
