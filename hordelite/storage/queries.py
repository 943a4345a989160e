"""Every query, written once for SQLite and PostgreSQL.

Each public function takes a ``Connection`` already inside a transaction (see
``Database``) and does one domain operation: submit a request, pop a job,
submit a job, read a status, cancel, sweep. Refusals are raised as HordeError
inside the transaction, which rolls it back: nothing stored, nothing charged.

Row locks on PostgreSQL are always taken in the same order (job, request,
users by id, worker) and the pop skips locked requests, so concurrent pops
never wait on each other and never hand one job to two workers.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    RowMapping,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.sql import ColumnElement, Select, Update

from hordelite.contract import admission, faults, refusals
from hordelite.contract import kudos as kudos_rules
from hordelite.contract.chat_declaration import ChatDeclaration
from hordelite.contract.chat_features import (
    IMAGE_TRANSPORT_BITS,
    ChatFeature,
    ChatGuarantee,
    ChatWorkerLimits,
)
from hordelite.contract.chat_reply import (
    ChatSubmit,
    Verdict,
    build_worker_chat_extras,
    judge_chat_reply,
    output_estimate_chars,
)
from hordelite.contract.chat_request import ChatRequest
from hordelite.contract.eligibility import (
    REQUEST_FIELDS,
    RequestView,
    WorkerView,
    can_serve,
    may_be_passed_over,
    passed_over,
    preferred_tokens,
    skipped_counts,
)
from hordelite.contract.limits import (
    MAX_AGENT_CHARS,
    SKIPPED_SAMPLE,
)
from hordelite.contract.presence import online_until
from hordelite.contract.progress import streams_progress
from hordelite.contract.text import JobSubmit, PopRequest
from hordelite.contract.unicode_rules import unsendable, worker_name_key
from hordelite.errors import RC, HordeError
from hordelite.storage.schema import (
    jobs,
    queue,
    queue_classes,
    request_workers,
    requests,
    users,
    workers,
)

_ALL_FEATURE_BITS = (
    sum(f.value for f in ChatFeature)
    | sum(g.value for g in ChatGuarantee)
    | sum(IMAGE_TRANSPORT_BITS.values())
)

# Statements on the hot paths (every pop, submit and status) are built once
# with bind parameters: SQLAlchemy then only binds values, which halves the
# cost of each statement against building it anew.
_USER_BY_KEY = select(users).where(users.c.key_hash == bindparam("key_hash"))
_WORKER_BY_KEY = select(workers).where(workers.c.name_key == bindparam("name_key"))
_INSERT_JOB = insert(jobs)
_INSERT_QUEUE = insert(queue)
_INSERT_REQUEST = insert(requests)
_DEQUEUE = delete(queue).where(queue.c.request_id == bindparam("rid"))
_CLASS_LAST_USED = select(queue_classes.c.last_used).where(
    queue_classes.c.model == bindparam("model"),
    queue_classes.c.kind == bindparam("kind"),
    queue_classes.c.features == bindparam("features"),
)
CLASS_REFRESH_SECONDS = 60.0
CLASS_IDLE_SECONDS = 3600.0
# The chat classes of a model whose required features a declaration covers.
_CHAT_CLASSES = select(queue_classes.c.features).where(
    queue_classes.c.model == bindparam("model"),
    queue_classes.c.kind == "chat",
    queue_classes.c.features.op("&")(bindparam("undeclared")) == 0,
)
# The best waiting requests, with only what eligibility reads (not their
# prompts or conversations).
_SKIPPED_SAMPLE = (
    select(*(requests.c[name] for name in REQUEST_FIELDS))
    .where(requests.c.state == "waiting", requests.c.remaining > 0)
    .order_by(requests.c.state, requests.c.anonymous, requests.c.prio_key.desc())
    .limit(SKIPPED_SAMPLE)
)
_HAS_OWN = select(queue.c.id).where(queue.c.user_id == bindparam("owner_id")).limit(1)
_ONLINE_WORKERS = (
    select(workers, users.c.trusted)
    .join(users, users.c.id == workers.c.user_id)
    .where(workers.c.online_until > bindparam("now"))
)
_ONLINE_CHAT_WORKERS = _ONLINE_WORKERS.where(workers.c.chat_model.is_not(None))
_ONLINE_CHAT_WORKERS_OF = _ONLINE_WORKERS.where(
    workers.c.chat_model.in_(bindparam("models", expanding=True))
)
_IN_FLIGHT = select(func.coalesce(func.sum(requests.c.n - requests.c.finished), 0)).where(
    requests.c.user_id == bindparam("user_id"), requests.c.state == "waiting"
)
_CLAIM = (
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
_JOB_WITH_REQUEST = (
    select(
        jobs,
        requests.c.user_id.label("requester_id"),
        requests.c.state.label("request_state"),
        requests.c.n,
        requests.c.finished,
        requests.c.max_length.label("request_max_length"),
    )
    .join(requests, requests.c.id == jobs.c.request_id)
    .where(jobs.c.id == bindparam("job_id"))
)
_FINISH_JOB = update(jobs).where(jobs.c.id == bindparam("job_id"))
_MOVE_KUDOS = (
    update(users)
    .where(users.c.id == bindparam("uid"))
    .values(
        kudos=users.c.kudos + bindparam("delta"),
        kudos_earned=users.c.kudos_earned + bindparam("earned"),
        kudos_spent=users.c.kudos_spent + bindparam("paid"),
    )
)
_CREDIT_WORKER = (
    update(workers)
    .where(workers.c.id == bindparam("wid"))
    .values(
        kudos_rewards=workers.c.kudos_rewards + bindparam("reward"),
        requests_fulfilled=workers.c.requests_fulfilled + 1,
        tokens_generated=workers.c.tokens_generated + bindparam("tokens"),
        seconds_generating=workers.c.seconds_generating + bindparam("seconds"),
    )
)
_FINISH_REQUEST = (
    update(requests)
    .where(requests.c.id == bindparam("rid"))
    .values(finished=requests.c.finished + 1, kudos=requests.c.kudos + bindparam("cost"))
    .returning(requests.c.finished, requests.c.n)
)
_REQUEST_BY_ID = select(requests).where(
    requests.c.id == bindparam("rid"), requests.c.kind == bindparam("kind")
)
# What a status reads of a request: not its prompt or conversation.
_STATUS_FIELDS = (
    "id",
    "state",
    "n",
    "remaining",
    "finished",
    "restarts",
    "kudos",
    "anonymous",
    "prio_key",
    "created",
    "ended",
    "context_adjustments",
    "fault_rc",
    "fault_message",
)
_REQUEST_STATUS = select(
    *(requests.c[name] for name in dict.fromkeys((*_STATUS_FIELDS, *REQUEST_FIELDS)))
).where(requests.c.id == bindparam("rid"), requests.c.kind == bindparam("kind"))
_GENERATION_FIELDS = (
    "id",
    "kind",
    "state",
    "worker_id",
    "model",
    "gen_state",
    "text",
    "seed",
    "gen_metadata",
    "tokens",
    "reply",
    "cost",
    "charge_basis",
)
_REQUEST_JOBS = (
    select(*(jobs.c[name] for name in _GENERATION_FIELDS), workers.c.name.label("worker_name"))
    .join(workers, workers.c.id == jobs.c.worker_id)
    .where(jobs.c.request_id == bindparam("rid"), jobs.c.state.in_(("done", "processing")))
    .order_by(jobs.c.submitted)
)


@dataclasses.dataclass(frozen=True)
class Rules:
    """The configuration values the queries need."""

    job_ttl: float
    request_expiry: float
    retention: float
    worker_online: float
    max_faults: int
    maintenance_aborts: int
    concurrency: int
    anonymous_concurrency: int
    allow_anonymous: bool


# Users ---------------------------------------------------------------------


def ensure_anonymous(conn: Connection, key_hash: str, now: float) -> None:
    """Create the anonymous user (id 0) once."""
    if conn.execute(select(users.c.id).where(users.c.id == 0)).first() is None:
        conn.execute(
            insert(users).values(
                id=0, username="Anonymous", key_hash=key_hash, anonymous=True, created=now
            )
        )


def create_user(
    conn: Connection,
    username: str,
    key_hash: str,
    kudos: float,
    admin: bool,
    trusted: bool,
    now: float,
) -> int:
    result = conn.execute(
        insert(users)
        .values(
            username=username,
            key_hash=key_hash,
            kudos=kudos,
            admin=admin,
            trusted=trusted,
            anonymous=False,
            created=now,
        )
        .returning(users.c.id)
    )
    return int(result.scalar_one())


def _user(conn: Connection, key_hash: str, rules: Rules) -> RowMapping:
    row = conn.execute(_USER_BY_KEY, {"key_hash": key_hash}).mappings().first()
    if row is None:
        raise HordeError(RC.InvalidAPIKey)
    if row["anonymous"] and not rules.allow_anonymous:
        raise HordeError(RC.AnonymousDisabled)
    return row


@dataclasses.dataclass(frozen=True)
class UserRecord:
    """A user as the service reads it (never its key hash)."""

    id: int
    username: str
    anonymous: bool
    admin: bool
    trusted: bool
    kudos: float
    kudos_earned: float
    kudos_spent: float
    concurrency: int | None  # None: the horde's default for its kind of user
    worker_ids: tuple[str, ...]


def user_by_key(conn: Connection, key_hash: str, rules: Rules) -> UserRecord:
    return _user_details(conn, _user(conn, key_hash, rules))


def user_by_id(conn: Connection, user_id: int) -> UserRecord:
    row = conn.execute(select(users).where(users.c.id == user_id)).mappings().first()
    if row is None:
        raise refusals.unknown_user(user_id)
    return _user_details(conn, row)


def _user_details(conn: Connection, row: RowMapping) -> UserRecord:
    worker_ids = conn.execute(select(workers.c.id).where(workers.c.user_id == row["id"])).scalars()
    return UserRecord(
        id=row["id"],
        username=row["username"],
        anonymous=bool(row["anonymous"]),
        admin=bool(row["admin"]),
        trusted=bool(row["trusted"]),
        kudos=row["kudos"],
        kudos_earned=row["kudos_earned"],
        kudos_spent=row["kudos_spent"],
        concurrency=row["concurrency"],
        worker_ids=tuple(worker_ids),
    )


# Requests ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NewRequest:
    """What ``submit_request`` stores: a text or a chat request.

    ``eligibility`` holds every field that decides which worker may take it,
    declared once in RequestView: the requests table has a column of each
    name and the queue rows are derived from it (``_queue_row``).
    """

    eligibility: RequestView
    prompt: str  # the text prompt, or the kept conversation flattened
    params: dict[str, Any]
    n: int
    quote: float  # the dry-run price, checked against kudos up front
    softprompt: str | None = None
    proxied_account: str | None = None
    webhook: str | None = None
    chat: dict[str, Any] | None = None
    submitted_prompt: str | None = None
    context_adjustments: list[dict[str, Any]] | None = None
    operation_key: str | None = None
    fingerprint: str | None = None
    # Queued instead when the kudos up front are missing (allow_downgrade).
    downgrade: NewRequest | None = None
    downgrade_field: str = "params.max_length"

    @property
    def kind(self) -> str:
        return self.eligibility.kind

    @property
    def max_length(self) -> int:
        return self.eligibility.max_length


@dataclasses.dataclass(frozen=True)
class Submitted:
    request_id: str
    queued: NewRequest
    view: RequestView
    possible: bool  # an online worker can serve it now
    replayed: bool  # an earlier request with the same operation key
    online: list[WorkerView] | None = None  # the online workers it was checked against


def submit_request(
    conn: Connection,
    key_hash: str,
    new: NewRequest,
    request_id: str,
    now: float,
    rules: Rules,
    upfront_max_length: int,
    client_agent: str,
) -> Submitted:
    """Queue a request, or find the one an operation key already queued.

    Raises InvalidAPIKey, WorkerNotFound, KudosUpfront, TooManyPrompts,
    OperationKeyReused (the key was used for a different request).
    """
    user = _user(conn, key_hash, rules)
    if new.operation_key is not None:
        first = _first_request(conn, user, new.operation_key, new.kind, new.fingerprint)
        if first is not None:
            return Submitted(first.id, new, new.eligibility, True, True)
    return _store(conn, user, new, request_id, now, rules, upfront_max_length, client_agent, None)


def submit_chat_request(
    conn: Connection,
    key_hash: str,
    operation_key: str | None,
    fingerprint: str | None,
    admit: Callable[[list[WorkerView]], NewRequest],
    request_id: str,
    now: float,
    rules: Rules,
    upfront_max_length: int,
    client_agent: str,
) -> Submitted | FirstRequest:
    """A chat submission in one transaction: authenticate, answer a resubmit
    of an operation key with its first request, else admit against the online workers
    (``admit(online)`` raises the refusals) and queue.
    """
    user = _user(conn, key_hash, rules)
    if operation_key is not None:
        first = _first_request(conn, user, operation_key, "chat", fingerprint)
        if first is not None:
            return first
    # Admission and the possible check read only chat workers: a chat
    # request cannot go to a worker without a chat declaration.
    online = _online_workers(conn, now, chat=True)
    new = admit(online)
    return _store(conn, user, new, request_id, now, rules, upfront_max_length, client_agent, online)


@dataclasses.dataclass(frozen=True)
class FirstRequest:
    """The request a user first queued under an operation key (a resubmit
    answers it)."""

    id: str
    max_length: int
    models: tuple[str, ...]


def _first_request(
    conn: Connection, user: RowMapping, operation_key: str, kind: str, fingerprint: str | None
) -> FirstRequest | None:
    """The request this user queued under ``operation_key``; 409 OperationKeyReused
    when that was a different request."""
    first = (
        conn.execute(
            select(
                requests.c.id,
                requests.c.kind,
                requests.c.fingerprint,
                requests.c.max_length,
                requests.c.models,
            ).where(requests.c.user_id == user["id"], requests.c.operation_key == operation_key)
        )
        .mappings()
        .first()
    )
    if first is None:
        return None
    if first["fingerprint"] != fingerprint or first["kind"] != kind:
        raise refusals.operation_key_reused()
    return FirstRequest(first["id"], first["max_length"], tuple(first["models"]))


def _store(
    conn: Connection,
    user: RowMapping,
    new: NewRequest,
    request_id: str,
    now: float,
    rules: Rules,
    upfront_max_length: int,
    client_agent: str,
    online: list[WorkerView] | None,
) -> Submitted:
    """Check what storing needs (worker ids, kudos up front, concurrency) and
    queue the request; ``online`` saves reading the online workers again."""
    listed = new.eligibility.worker_ids
    if listed:
        found = set(conn.execute(select(workers.c.id).where(workers.c.id.in_(listed))).scalars())
        missing = [w for w in listed if w not in found]
        if missing:
            raise refusals.unknown_listed_worker(missing[0])
    new = _check_upfront(new, user, upfront_max_length)
    _check_concurrency(conn, user, new.n, rules)
    view = new.eligibility
    row = {
        **_eligibility_columns(view),
        "id": request_id,
        "user_id": user["id"],
        "state": "waiting",
        "prompt": new.prompt,
        "params": {**new.params, "n": new.n},
        "softprompt": new.softprompt,
        "n": new.n,
        "remaining": new.n,
        "finished": 0,
        "anonymous": bool(user["anonymous"]),
        "priority": float(user["kudos"]),
        "prio_key": kudos_rules.priority_key(float(user["kudos"]), now),
        "kudos": 0.0,
        "faults": 0,
        "restarts": 0,
        "created": now,
        "expires": now + rules.request_expiry,
        "client_agent": client_agent[:MAX_AGENT_CHARS],
        "proxied_account": new.proxied_account,
        "webhook": new.webhook,
        "chat": new.chat,
        "submitted_prompt": new.submitted_prompt,
        "context_adjustments": new.context_adjustments,
        "operation_key": new.operation_key,
        "fingerprint": new.fingerprint,
    }
    conn.execute(_INSERT_REQUEST, row)
    if listed:
        conn.execute(
            insert(request_workers),
            [{"request_id": request_id, "worker_id": w} for w in listed],
        )
    _enqueue(conn, row, view, now)
    if online is None:
        online = _online_workers(conn, now)
    possible = any(can_serve(w, view) for w in online)
    return Submitted(request_id, new, view, possible, False, online)


def _eligibility_columns(view: RequestView) -> dict[str, Any]:
    """The requests columns of a view (REQUEST_FIELDS; sequences as JSON lists)."""
    columns = {name: getattr(view, name) for name in REQUEST_FIELDS}
    return {**columns, "models": list(view.models), "worker_ids": list(view.worker_ids)}


def _check_upfront(new: NewRequest, user: RowMapping, upfront_max_length: int) -> NewRequest:
    decision = admission.upfront(
        new.max_length,
        upfront_max_length,
        new.quote,
        user["kudos"],
        user["anonymous"],
        new.downgrade is not None,
    )
    if decision == "accepted":
        return new
    if decision == "downgrade" and new.downgrade is not None:
        return new.downgrade
    raise refusals.kudos_upfront(
        new.downgrade_field, new.max_length, upfront_max_length, new.quote, user["kudos"], new.kind
    )


def _check_concurrency(conn: Connection, user: RowMapping, n: int, rules: Rules) -> None:
    limit = admission.concurrency_limit(
        user["concurrency"], user["anonymous"], rules.concurrency, rules.anonymous_concurrency
    )
    if admission.unlimited(limit):
        return  # without a limit, no read of the generations in flight
    in_flight = conn.execute(_IN_FLIGHT, {"user_id": user["id"]}).scalar_one()
    if admission.over_limit(in_flight, n, limit):
        raise refusals.too_many_in_flight(in_flight, limit)


def _enqueue(
    conn: Connection, req: dict[str, Any] | RowMapping, view: RequestView, now: float
) -> None:
    """The queue rows of a request that has jobs to hand out (one per model)."""
    base = {
        "request_id": req["id"],
        "user_id": req["user_id"],
        "anonymous": req["anonymous"],
        "prio_key": req["prio_key"],
        "created": req["created"],
        **_queue_row(view),
    }
    models = view.models or ("",)
    conn.execute(_INSERT_QUEUE, [{**base, "model": m} for m in models])
    if view.kind == "chat":
        for model in models:
            _use_class(conn, {"model": model, "kind": "chat", "features": view.features}, now)


def _queue_row(view: RequestView) -> dict[str, Any]:
    """The queue columns the pop's candidate query filters on, from the
    request's eligibility fields (one row per model adds ``model``)."""
    listed = 0 if not view.worker_ids else 2 if view.worker_blacklist else 1
    return {
        "max_length": view.max_length,
        "max_context_length": view.max_context_length,
        "trusted_only": view.trusted_workers,
        "fast_only": not view.slow_workers,
        "nsfw": view.nsfw,
        "worker_filter": listed,
        "kind": view.kind,
        "features": view.features,
        "context_tokens": view.context_tokens,
        "tools_temperature": view.tools_temperature,
    }


def _use_class(conn: Connection, key: dict[str, Any], now: float) -> None:
    """Make sure a chat pop will visit this class (see queue_classes.last_used)."""
    last_used = conn.execute(_CLASS_LAST_USED, key).scalar()
    if last_used is not None and last_used >= now - CLASS_REFRESH_SECONDS:
        return
    if last_used is not None:
        touched = conn.execute(
            update(queue_classes)
            .where(
                queue_classes.c.model == key["model"],
                queue_classes.c.kind == key["kind"],
                queue_classes.c.features == key["features"],
            )
            .values(last_used=now)
        ).rowcount
        if touched:
            return
    conn.execute(insert(queue_classes).values(**key, last_used=now))


def _dequeue(conn: Connection, request_id: str) -> None:
    conn.execute(_DEQUEUE, {"rid": request_id})


def _get_request(conn: Connection, request_id: str, kind: str, lock: bool = False) -> RowMapping:
    q = _REQUEST_BY_ID.with_for_update() if lock else _REQUEST_BY_ID
    row = conn.execute(q, {"rid": request_id, "kind": kind}).mappings().first()
    if row is None:
        raise refusals.unknown_request(kind, request_id)
    return row


@dataclasses.dataclass(frozen=True)
class StoredRequest:
    """What a status reads of a stored request (``view``: its eligibility)."""

    id: str
    view: RequestView
    state: str
    n: int
    remaining: int
    finished: int
    restarts: int
    kudos: float
    anonymous: bool
    prio_key: float
    created: float
    ended: float | None
    context_adjustments: list[dict[str, Any]] | None
    fault_rc: str | None
    fault_message: str | None

    @property
    def kind(self) -> str:
        return self.view.kind

    @property
    def queued(self) -> bool:
        """Waiting for a worker to take a job (not only for jobs in progress)."""
        return self.state == "waiting" and self.remaining > 0

    @classmethod
    def of(cls, row: RowMapping) -> StoredRequest:
        return cls(view=RequestView.of(row), **{name: row[name] for name in _STATUS_FIELDS})


@dataclasses.dataclass(frozen=True)
class StoredJob:
    """A job of a request that a worker holds or finished, with its reply."""

    id: str
    kind: str
    state: str  # "processing" or "done"
    worker_id: str
    worker_name: str
    model: str
    gen_state: str | None
    text: str | None
    seed: int | None
    gen_metadata: list[dict[str, Any]] | None
    tokens: int | None
    reply: dict[str, Any] | None
    cost: float | None
    charge_basis: str | None

    @classmethod
    def of(cls, row: RowMapping) -> StoredJob:
        return cls(
            worker_name=row["worker_name"], **{name: row[name] for name in _GENERATION_FIELDS}
        )


@dataclasses.dataclass(frozen=True)
class StatusSnapshot:
    """What a status answer is made of, read in one transaction.

    ``online``: the online workers that could matter (none once every job is
    handed out); ``position``: the waiting requests ahead; ``busy``: the jobs
    in progress of each online worker, when asked for.
    """

    request: StoredRequest
    jobs: tuple[StoredJob, ...]
    online: tuple[WorkerView, ...]
    position: int
    busy: dict[str, int] | None = None


def request_status(
    conn: Connection,
    request_id: str,
    kind: str,
    now: float,
    rules: Rules,
    with_position: bool = True,
    with_busy: bool = False,
) -> StatusSnapshot:
    """The parts of a status answer (the service renders them).

    ``with_position`` False skips the queue position (a count that follows
    the position): a waiting OpenAI call re-checking its request needs only
    whether it ended and whether it is possible. ``with_busy`` adds
    ``busy``: the jobs in progress of each online worker.
    """
    row = conn.execute(_REQUEST_STATUS, {"rid": request_id, "kind": kind}).mappings().first()
    if row is None:
        raise refusals.unknown_request(kind, request_id)
    req = StoredRequest.of(row)
    gens = conn.execute(_REQUEST_JOBS, {"rid": request_id}).mappings()
    # Once every job is in a worker's hands, eligibility and the queue ahead
    # no longer matter: the status skips both reads.
    queued = req.queued
    # A chat request can only go to a chat worker of one of its models, and
    # its status reads nothing else of the pool (eligibility, the impossible
    # reason): read just those, not every online text worker.
    chat = req.kind == "chat"
    online = _online_workers(conn, now, chat=chat, models=req.view.models) if queued else []
    position = _queue_position(conn, req) if with_position and queued else 0
    busy = _busy(conn, [w.id for w in online]) if with_busy and queued else None
    return StatusSnapshot(req, tuple(StoredJob.of(g) for g in gens), tuple(online), position, busy)


def _busy(conn: Connection, worker_ids: list[str]) -> dict[str, int]:
    """Jobs in progress per worker, for these workers (read along ix_jobs_state_lease)."""
    if not worker_ids:
        return {}
    rows = conn.execute(
        select(jobs.c.worker_id, func.count())
        .where(jobs.c.state == "processing", jobs.c.worker_id.in_(worker_ids))
        .group_by(jobs.c.worker_id)
    )
    return {worker_id: int(count) for worker_id, count in rows}


def _queue_position(conn: Connection, req: StoredRequest) -> int:
    """Waiting requests ahead of this one that compete for its models.

    Read along ix_queue_order (one range per model), so the cost follows the
    position, not the length of the queue.
    """
    anon, key = req.anonymous, req.prio_key
    if req.view.models:
        table, rid = queue, queue.c.request_id
        where: list[ColumnElement[bool]] = [queue.c.model.in_([*req.view.models, ""])]
    else:  # any model: every waiting request competes
        table, rid = requests, requests.c.id
        where = [requests.c.state == "waiting", requests.c.remaining > 0]
    count = func.count(func.distinct(rid))
    ahead = conn.execute(
        select(count).where(*where, table.c.anonymous == anon, table.c.prio_key > key)
    ).scalar_one()
    if anon:  # every registered request comes first
        ahead += conn.execute(
            select(count).where(*where, table.c.anonymous.is_(False))
        ).scalar_one()
    return int(ahead)


def cancel_request(
    conn: Connection,
    request_id: str,
    kind: str,
    now: float,
    rules: Rules,
    posted: dict[str, int] | None = None,
    billions: Callable[[str], float] | None = None,
) -> StatusSnapshot:
    """End a waiting request; returns its status parts as they were before.

    ``posted`` maps the request's streamed jobs to the characters of content
    and reasoning their workers posted: each is settled on them (the worker
    rewarded, the requester charged, no dropped job). A job that does not
    stream is not settled.
    """
    status = request_status(conn, request_id, kind, now, rules)
    req = status.request
    if req.state == "waiting":
        for job_id, chars in (posted or {}).items():
            job = (
                conn.execute(_JOB_WITH_REQUEST.with_for_update(), {"job_id": job_id})
                .mappings()
                .first()
            )
            if job is None or job["state"] != "processing" or billions is None:
                continue
            paid = _settlement(job, chars, now, billions)
            _settle(conn, job, paid, {"charge_basis": "output_estimate"}, now, "cancelled")
        _end_request(conn, req.id, "cancelled", now, abort_jobs=False)
    return status


def _end_request(
    conn: Connection, request_id: str, state: str, now: float, abort_jobs: bool = True
) -> None:
    """End a request: out of the queue; with ``abort_jobs`` its jobs still
    out are aborted (a late submit gets AbortedGen and charges nobody).

    A client's cancel does not abort them (worker guide, step 7): a job that does not
    stream is submitted as usual and rewarded for its reply.
    """
    conn.execute(
        update(requests)
        .where(requests.c.id == request_id)
        .values(state=state, ended=now, remaining=0)
    )
    if abort_jobs:
        conn.execute(
            update(jobs)
            .where(jobs.c.request_id == request_id, jobs.c.state == "processing")
            .values(state="cancelled")
        )
    _dequeue(conn, request_id)


# Workers -------------------------------------------------------------------


def _online_workers(
    conn: Connection,
    now: float,
    *,
    chat: bool = False,
    models: Sequence[str] | None = None,
) -> list[WorkerView]:
    """Workers online now. ``chat``: only those that take chat jobs (a chat
    request reads nothing of the others), and with ``models`` only those
    whose chat model is one of them (read along ix_workers_chat_model)."""
    if not chat:
        rows = conn.execute(_ONLINE_WORKERS, {"now": now}).mappings()
    elif models is None:
        rows = conn.execute(_ONLINE_CHAT_WORKERS, {"now": now}).mappings()
    else:
        params = {"now": now, "models": list(models)}
        rows = conn.execute(_ONLINE_CHAT_WORKERS_OF, params).mappings()
    return [_worker_view(r) for r in rows]


def _worker_view(row: RowMapping | dict[str, Any]) -> WorkerView:
    return WorkerView(
        id=row["id"],
        models=tuple(row["models"]),
        max_length=row["max_length"],
        max_context_length=row["max_context_length"],
        nsfw=row["nsfw"],
        trusted=bool(row["trusted"]),
        threads=row["threads"],
        extra_slow=row["extra_slow"],
        maintenance=row["maintenance"],
        tokens_generated=row["tokens_generated"],
        seconds_generating=row["seconds_generating"],
        prompt_jobs=bool(row["prompt_jobs"]),
        **_chat_view(row["chat"]),
    )


def _chat_view(chat: dict[str, Any] | None) -> dict[str, Any]:
    """WorkerView's chat fields from a stored (or popped) declaration."""
    if not chat:
        return {}
    declaration = ChatDeclaration(
        model_id=chat["model_id"],
        features=tuple(chat["features"]),
        limits=ChatWorkerLimits(**chat["limits"]),
        image_transports=tuple(chat["image_transports"]),
    )
    return {
        "chat_model": declaration.model_id,
        "chat_features": declaration.features,
        "chat_mask": declaration.mask,
        "chat_max_context_length": declaration.limits.max_context_length,
        "chat_max_length": declaration.limits.max_length,
        "tools_max_temperature": declaration.limits.tools_max_temperature,
    }


def online_workers(conn: Connection, now: float) -> list[WorkerView]:
    return _online_workers(conn, now)


def _validate_worker(
    conn: Connection, user: RowMapping, pop: PopRequest, name_key: str
) -> RowMapping | None:
    """The worker row for this pop's name, or None on its first pop.

    A worker name belongs to the user who first popped with it; names are
    compared by their key, so "ALICE" is the worker first named "Alice", and
    another user's look-alike of a name is that name. Read without a lock:
    the row is updated after the claim (``_touch_worker``), so a pop locks
    its request before its worker, in the order submits take them.
    """
    row = conn.execute(_WORKER_BY_KEY, {"name_key": name_key}).mappings().first()
    if row is None:
        return None
    if row["user_id"] != user["id"]:
        raise refusals.worker_name_taken(pop.name, row["name"])
    if row["maintenance"]:
        raise refusals.worker_in_maintenance(pop.name, row["id"])
    return row


def _declaration(pop: PopRequest, now: float) -> dict[str, Any]:
    return {
        "bridge_agent": pop.bridge_agent,
        "models": list(pop.models),
        "max_length": pop.max_length,
        "max_context_length": pop.max_context_length,
        "nsfw": pop.nsfw,
        "threads": pop.threads,
        "extra_slow": pop.extra_slow_worker,
        "last_check_in": now,
        # Stored from every pop: a pop without chat_jobs withdraws it.
        "chat": pop.chat.to_json() if pop.chat else None,
        "chat_model": pop.chat.model_id if pop.chat else None,
        "prompt_jobs": pop.prompt_jobs,
    }


# Every pop of a known worker runs this: the statement is built once per
# set of columns (one, in practice), not per pop.
@functools.cache
def _touch_statement(columns: tuple[str, ...]) -> Update:
    return (
        update(workers)
        .where(workers.c.id == bindparam("worker_id"))
        .values({c: bindparam(c, type_=workers.c[c].type) for c in columns})
    )


def _touch_worker(
    conn: Connection, row: RowMapping, pop: PopRequest, now: float, rules: Rules, until: float
) -> None:
    """Store the declaration of this pop: the worker is online from now until ``until``."""
    gap = now - row["last_check_in"]
    uptime = row["uptime"] + gap if 0 < gap <= rules.worker_online else row["uptime"]
    values = {**_declaration(pop, now), "online_until": until, "uptime": uptime}
    conn.execute(_touch_statement(tuple(values)), {"worker_id": row["id"], **values})


@dataclasses.dataclass(frozen=True)
class WorkerChanges:
    """What a worker update changed; None: left as it was."""

    maintenance: bool | None = None
    aborts_in_window: int | None = None  # reset when maintenance is cleared
    online: bool | None = None  # False: the worker said it stops


def update_worker(
    conn: Connection,
    key_hash: str,
    worker_id: str,
    maintenance: bool | None,
    rules: Rules,
    offline_at: float | None = None,
) -> WorkerChanges:
    """``offline_at``: the worker says it stops; it is offline from then
    until its next pop (hordelite.contract.presence)."""
    user = _user(conn, key_hash, rules)
    row = (
        conn.execute(select(workers).where(workers.c.id == worker_id).with_for_update())
        .mappings()
        .first()
    )
    if row is None:
        raise refusals.unknown_worker(worker_id)
    if row["user_id"] != user["id"] and not user["admin"]:
        raise refusals.not_the_workers_owner()
    values: dict[str, Any] = {}
    if maintenance is not None:
        values["maintenance"] = maintenance
        if not maintenance:
            values["aborts_in_window"] = 0
    if offline_at is not None:
        values["online_until"] = min(row["online_until"], offline_at)
    if values:
        conn.execute(update(workers).where(workers.c.id == worker_id).values(**values))
    # The answer lists what changed: clearing maintenance also reset the count.
    return WorkerChanges(
        maintenance=maintenance,
        aborts_in_window=values.get("aborts_in_window"),
        online=False if offline_at is not None else None,
    )


@dataclasses.dataclass(frozen=True)
class WorkerRecord:
    """A worker with its owner's name and trust, as the service reads it."""

    id: str
    name: str
    owner: str  # the owner's username
    trusted: bool  # the owner's trust
    bridge_agent: str
    models: tuple[str, ...]
    max_length: int
    max_context_length: int
    nsfw: bool
    threads: int
    maintenance: bool
    online_until: float
    uptime: float
    requests_fulfilled: int
    uncompleted_jobs: int
    aborts_in_window: int
    kudos_rewards: float
    tokens_generated: float
    seconds_generating: float
    chat: dict[str, Any] | None  # the chat declaration of the last pop, as sent
    prompt_jobs: bool
    nonconformant_replies: int


# A worker with its owner's trust and name (worker details, the worker list).
_WORKER_DETAILS = select(workers, users.c.trusted, users.c.username).join(
    users, users.c.id == workers.c.user_id
)


def _worker_record(row: RowMapping) -> WorkerRecord:
    return WorkerRecord(
        id=row["id"],
        name=row["name"],
        owner=row["username"],
        trusted=bool(row["trusted"]),
        bridge_agent=row["bridge_agent"],
        models=tuple(row["models"]),
        max_length=row["max_length"],
        max_context_length=row["max_context_length"],
        nsfw=bool(row["nsfw"]),
        threads=row["threads"],
        maintenance=bool(row["maintenance"]),
        online_until=row["online_until"],
        uptime=row["uptime"],
        requests_fulfilled=row["requests_fulfilled"],
        uncompleted_jobs=row["uncompleted_jobs"],
        aborts_in_window=row["aborts_in_window"],
        kudos_rewards=row["kudos_rewards"],
        tokens_generated=row["tokens_generated"],
        seconds_generating=row["seconds_generating"],
        chat=row["chat"],
        prompt_jobs=bool(row["prompt_jobs"]),
        nonconformant_replies=row["nonconformant_replies"],
    )


def worker_details(
    conn: Connection, worker_id: str | None = None, name_key: str | None = None
) -> WorkerRecord | None:
    """A worker with its owner's trust and name, by id or by name key; None
    when there is none."""
    q = (
        _WORKER_DETAILS.where(workers.c.id == worker_id)
        if worker_id is not None
        else _WORKER_DETAILS.where(workers.c.name_key == name_key)
    )
    row = conn.execute(q).mappings().first()
    return None if row is None else _worker_record(row)


def list_workers(conn: Connection, now: float) -> list[WorkerRecord]:
    q = _WORKER_DETAILS.where(workers.c.online_until > now).order_by(workers.c.name)
    return [_worker_record(r) for r in conn.execute(q).mappings()]


# Pop -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PoppedJob:
    id: str
    request_id: str
    model: str
    payload: dict[str, Any]
    softprompt: str | None
    ttl: float
    chat: bool = False
    stream: bool = False  # popped with stream_progress: it gets a progress lease
    gen: int = 0  # the attempt of the request (its restarts so far)
    max_length: int = 0


@dataclasses.dataclass(frozen=True)
class PopResult:
    worker: WorkerView
    job: PoppedJob | None
    skipped: dict[str, int]


def pop_job(
    conn: Connection,
    key_hash: str,
    pop: PopRequest,
    now: float,
    rules: Rules,
    with_skipped: bool,
    skip_locked: bool,
    poll_left: float | None = None,
    sample: Sequence[RequestView] | None = None,
) -> PopResult:
    """Check the worker in and hand it the best job it may take, if any.

    ``poll_left``: seconds this long-polled pop still waits after this
    attempt (None: it does not long-poll); how long the check-in lasts
    depends on it (hordelite.contract.presence). ``sample``: the waiting
    requests ``skipped`` is counted over (``skipped_sample``), when the
    caller already holds them; read here otherwise."""
    user = _user(conn, key_hash, rules)
    if user["anonymous"]:
        raise HordeError(RC.AnonForbiddenWorker)
    name_key = worker_name_key(pop.name)
    row = _validate_worker(conn, user, pop, name_key)
    if row is None:
        # First pop: the worker exists (and is online) from this transaction.
        values = {
            "id": str(uuid.uuid4()),
            "name": pop.name,
            "name_key": name_key,
            "user_id": user["id"],
            "created": now,
        }
        online = {"online_until": now + rules.worker_online}
        conn.execute(insert(workers).values(**values, **_declaration(pop, now), **online))
        row = conn.execute(_WORKER_BY_KEY, {"name_key": name_key}).mappings().one()
        fresh = True
    else:
        fresh = False
    worker = _worker_view({**row, **_declaration(pop, now), "trusted": user["trusted"]})
    job = _claim(conn, worker, user["id"], now, rules, skip_locked)
    until = online_until(
        now,
        handed_job=job is not None,
        poll_left=poll_left,
        wait=pop.wait,
        worker_online=rules.worker_online,
    )
    if not fresh:
        _touch_worker(conn, row, pop, now, rules, until)
    elif until != row["online_until"]:
        conn.execute(update(workers).where(workers.c.id == row["id"]).values(online_until=until))
    skipped: dict[str, int] = {}
    if job is None and with_skipped:
        skipped = skipped_counts(worker, skipped_sample(conn) if sample is None else sample)
    return PopResult(worker, job, skipped)


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
    q = select(
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
        # A chat worker's limits: its reply length, and the conversation's
        # estimate plus the reply within its context.
        q = q.where(
            queue.c.max_length <= bindparam("max_length"),
            queue.c.context_tokens + queue.c.max_length <= bindparam("max_context_length"),
        )
        if capped:
            # A slow worker, while a faster one serves the model: only what
            # it generates within the job lease preference (``slow_cap``).
            # Requests naming their workers are exempt: only they may serve them.
            q = q.where(
                or_(queue.c.max_length <= bindparam("slow_cap"), queue.c.worker_filter == 1)
            )
        if tools_limit:
            q = q.where(
                or_(
                    queue.c.tools_temperature.is_(None),
                    queue.c.tools_temperature <= bindparam("tools_max_temperature"),
                )
            )
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
    return q.order_by(queue.c.anonymous, queue.c.prio_key.desc(), queue.c.created).limit(1)


@dataclasses.dataclass(frozen=True)
class _Class:
    """One walk of the queue: a model, a kind and a required feature set."""

    kind: str
    model: str
    features: int


def _classes(conn: Connection, worker: WorkerView) -> list[_Class]:
    """The queue classes this worker's declaration covers."""
    classes = []
    if worker.prompt_jobs:
        classes += [_Class("text", m, 0) for m in [*worker.models, ""]]
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


def _slower_than_another(conn: Connection, worker: WorkerView, now: float) -> bool:
    """Whether this chat worker's jobs are capped (eligibility.passed_over).
    Fast workers (the usual case) cost no query."""
    model = worker.chat_model
    if model is None or not may_be_passed_over(worker):
        return False
    chat_peers = _online_workers(conn, now, chat=True, models=[model])
    return passed_over(worker, chat_peers)


def _candidate_query(worker: WorkerView, model: str, skip_locked: bool) -> Select[Any]:
    """The text candidate query with this worker's values bound (for inspection)."""
    cls = _Class("text", model, 0)
    params = _candidate_params(worker, cls, 0)
    del params["owner_id"], params["tools_max_temperature"]
    return _statement_for(worker, cls, skip_locked, False).params(**params)


def _best_candidate(
    conn: Connection,
    worker: WorkerView,
    owner_id: int,
    skip_locked: bool,
    exclude: set[str],
    capped: bool = False,
) -> dict[str, Any] | None:
    candidates: list[dict[str, Any]] = []
    # The owner's own requests come first; most owners have none queued.
    has_own = conn.execute(_HAS_OWN, {"owner_id": owner_id}).first() is not None
    for cls in _classes(conn, worker):
        params = _candidate_params(worker, cls, owner_id)
        for own in (True, False) if has_own else (False,):
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
    conn: Connection, worker: WorkerView, owner_id: int, now: float, rules: Rules, skip_locked: bool
) -> PoppedJob | None:
    exclude: set[str] = set()
    capped = _slower_than_another(conn, worker, now)
    for _ in range(4):
        cand = _best_candidate(conn, worker, owner_id, skip_locked, exclude, capped)
        if cand is None and skip_locked:
            # Skipping passed over requests that other pops hold locked. A
            # request with n > 1 may still have jobs once their claim commits:
            # look again without the lock; the conditional update below then
            # waits for that claim instead of answering "no job".
            cand = _best_candidate(conn, worker, owner_id, False, exclude, capped)
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
            _dequeue(conn, cand["request_id"])
        return _assign(conn, worker, owner_id, cand, claimed, now, rules)
    return None


def _assign(
    conn: Connection,
    worker: WorkerView,
    owner_id: int,
    cand: dict[str, Any],
    claimed: RowMapping,
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
    conn.execute(
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
    stream = False
    if chat:
        request = ChatRequest.from_json(claimed["chat"])
        stream = streams_progress(request)
        payload = build_worker_chat_extras(
            request,
            frozenset(worker.chat_features),
            max_length,
            max_context_length,
            stream_progress=stream,
        )
    else:
        payload = {**claimed["params"], "prompt": claimed["prompt"], "n": 1}
    return PoppedJob(
        job_id,
        cand["request_id"],
        model,
        payload,
        claimed["softprompt"],
        rules.job_ttl,
        chat,
        stream,
        claimed["restarts"],
        max_length,
    )


def skipped_sample(conn: Connection) -> list[RequestView]:
    """The best waiting requests (SKIPPED_SAMPLE of them), as eligibility sees them."""
    return [request_view(row) for row in conn.execute(_SKIPPED_SAMPLE).mappings()]


def request_view(row: RowMapping | dict[str, Any]) -> RequestView:
    return RequestView.of(row)


# Submit --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SubmitResult:
    reward: float
    request_id: str
    request_ended: bool  # done or faulted: waiters can be told
    requeued: bool  # a faulted job went back to the queue
    # A refused chat reply: recorded on the job (a later fault counts by it),
    # then raised by the service once this transaction has committed.
    refusal: HordeError | None = None


def record_refusal(conn: Connection, key_hash: str, job_id: str, refusal: HordeError) -> None:
    """Record on its chat job a reply refused before it reached the job (a
    malformed structured submit), as the checks against the request record
    theirs: a fault with reply_refused then reports this refusal's message.
    Records nothing for an unknown key, another user's job or a job no longer
    processing; the caller raises the refusal either way."""
    user = conn.execute(_USER_BY_KEY, {"key_hash": key_hash}).mappings().first()
    if user is None:
        return
    conn.execute(
        _FINISH_JOB.where(
            jobs.c.owner_id == user["id"], jobs.c.state == "processing", jobs.c.kind == "chat"
        ),
        {"job_id": job_id, "refusal_rc": refusal.rc.name, "refusal_message": refusal.message},
    )


def chat_job_to_judge(
    conn: Connection, key_hash: str, job_id: str
) -> tuple[str, dict[str, Any]] | None:
    """The model and stored chat request of a chat job in progress that the
    key's user's worker holds (what a reply is judged against before the
    write transaction), or None: then submit_job refuses or judges it."""
    row = (
        conn.execute(
            select(jobs.c.model, requests.c.chat)
            .join(requests, requests.c.id == jobs.c.request_id)
            .join(users, users.c.id == jobs.c.owner_id)
            .where(
                jobs.c.id == job_id,
                jobs.c.state == "processing",
                jobs.c.kind == "chat",
                users.c.key_hash == key_hash,
            )
        )
        .mappings()
        .first()
    )
    if row is None:
        return None
    return row["model"], row["chat"]


def submit_job(
    conn: Connection,
    key_hash: str,
    sub: JobSubmit | ChatSubmit,
    now: float,
    rules: Rules,
    billions: Callable[[str], float],
    lease_until: float | None = None,
    verdict: Verdict | None = None,
) -> SubmitResult:
    """Store a worker's answer to a job: a text generation, a chat reply, or a fault.

    ``lease_until``: the end of the job's progress lease, which progress
    posts may have extended past the stored one. ``verdict``: the chat reply
    already judged against this job outside the transaction (without it, or
    judged against another job or model, it is judged here).
    """
    user = _user(conn, key_hash, rules)
    # Locks the job and its request (PostgreSQL), in that order.
    job = conn.execute(_JOB_WITH_REQUEST.with_for_update(), {"job_id": sub.id}).mappings().first()
    if job is None:
        raise refusals.unknown_job(sub.id)
    chat = isinstance(sub, ChatSubmit)
    refusal = refusals.submit_refusal(
        job["state"],
        job["kind"],
        job["owner_id"] == user["id"],
        max(job["lease_expires"], lease_until or 0),
        now,
        "chat" if chat else "text",
        sub.state == "faulted",
    )
    if refusal is not None:
        raise refusal
    if sub.state == "faulted":
        reason = sub.fault_reason if isinstance(sub, ChatSubmit) else None
        return _fault_job(conn, job, now, rules, reason)
    if isinstance(sub, ChatSubmit):
        return _accept_chat_reply(conn, job, sub, now, billions, verdict)
    paid = _settlement(job, len(sub.generation), now, billions)
    values = {
        "text": sub.generation,
        "gen_state": sub.state,
        "seed": sub.seed,
        "gen_metadata": sub.gen_metadata,
    }
    return _settle(conn, job, paid, values, now)


def _accept_chat_reply(
    conn: Connection,
    job: RowMapping,
    sub: ChatSubmit,
    now: float,
    billions: Callable[[str], float],
    verdict: Verdict | None,
) -> SubmitResult:
    if verdict is None or verdict.job_id != job["id"] or verdict.model != job["model"]:
        chat = conn.execute(
            select(requests.c.chat).where(requests.c.id == job["request_id"])
        ).scalar_one()
        verdict = judge_chat_reply(job["id"], job["model"], ChatRequest.from_json(chat), sub)
    reply, refusal = verdict.reply, verdict.refusal
    if refusal is not None:
        conn.execute(
            _FINISH_JOB,
            {
                "job_id": job["id"],
                "refusal_rc": refusal.rc.name,
                "refusal_message": refusal.message,
            },
        )
        return SubmitResult(0.0, job["request_id"], False, False, refusal)
    assert reply is not None
    paid = _settlement(job, output_estimate_chars(reply), now, billions)
    values = {
        "text": reply.content,
        "gen_state": sub.state,
        "reply": reply.to_json(),
        "charge_basis": "output_estimate",
    }
    return _settle(conn, job, paid, values, now)


def _settlement(
    job: RowMapping, chars: int, now: float, billions: Callable[[str], float]
) -> kudos_rules.Settlement:
    """What the job of this row moves for ``chars`` characters of output."""
    return kudos_rules.settle(
        chars, job["request_max_length"], billions(job["model"]), job["started"], now
    )


def _settle(
    conn: Connection,
    job: RowMapping,
    paid: kudos_rules.Settlement,
    values: dict[str, Any],
    now: float,
    state: str = "done",
) -> SubmitResult:
    """Store a finished job: reward its worker's owner, charge the requester,
    with the amounts of ``paid``.

    A job settled at a cancel ends ``cancelled``: paid, not a generation.
    """
    tokens, reward, cost = paid.tokens, paid.reward, paid.cost
    conn.execute(
        _FINISH_JOB,
        {
            "job_id": job["id"],
            "state": state,
            "submitted": now,
            "tokens": tokens,
            "reward": reward,
            "cost": cost,
            **values,
        },
    )
    _move_kudos(conn, payer=job["requester_id"], cost=cost, earner=job["owner_id"], reward=reward)
    conn.execute(
        _CREDIT_WORKER,
        {
            "wid": job["worker_id"],
            "reward": reward,
            "tokens": tokens,
            "seconds": paid.seconds,
        },
    )
    if state != "done":
        conn.execute(
            update(requests)
            .where(requests.c.id == job["request_id"])
            .values(kudos=requests.c.kudos + cost)
        )
        return SubmitResult(reward, job["request_id"], False, False)
    counts = conn.execute(_FINISH_REQUEST, {"rid": job["request_id"], "cost": cost}).one()
    done = counts.finished >= counts.n
    if done:
        # A cancelled request stays cancelled when its last job comes in.
        conn.execute(
            update(requests)
            .where(requests.c.id == job["request_id"], requests.c.state == "waiting")
            .values(state="done", ended=now, remaining=0)
        )
    return SubmitResult(reward, job["request_id"], done, False)


def _move_kudos(conn: Connection, payer: int, cost: float, earner: int, reward: float) -> None:
    for move in kudos_rules.kudos_moves(payer, cost, earner, reward):
        conn.execute(
            _MOVE_KUDOS,
            {"uid": move.user_id, "delta": move.delta, "earned": move.earned, "paid": move.paid},
        )


def _fault_job(
    conn: Connection, job: RowMapping, now: float, rules: Rules, reason: str | None
) -> SubmitResult:
    """A job the worker gave up on: back to the queue, or the request faults,
    as ``faults.job_fault`` decides."""
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job["id"])
        .values(state="faulted", submitted=now, gen_state="faulted", fault_reason=reason)
    )
    req = _get_request(conn, job["request_id"], job["kind"])
    decision = faults.job_fault(
        reason, job["refusal_rc"], job["refusal_message"], _holds_unsendable(req)
    )
    if decision.end_request:
        _fault_request(conn, req, now, decision.fault)
        return SubmitResult(0.0, req["id"], True, False)
    _charge(conn, job["worker_id"], decision.charge, now, rules)
    requeued, ended = _give_back(conn, req, now, rules, decision)
    return SubmitResult(0.0, req["id"], ended, requeued)


def _charge(
    conn: Connection, worker_id: str, charge: faults.Charge, now: float, rules: Rules
) -> None:
    """Add a job given back to the worker counter ``charge`` names."""
    if charge == "nonconformant":
        conn.execute(
            update(workers)
            .where(workers.c.id == worker_id)
            .values(nonconformant_replies=workers.c.nonconformant_replies + 1)
        )
    elif charge == "abort":
        _count_abort(conn, worker_id, now, rules)


def _holds_unsendable(req: RowMapping) -> bool:
    """The request's text or parameters hold what no worker can encode."""
    return unsendable([req["prompt"], req["params"], req["chat"]]) is not None


def _fault_request(conn: Connection, req: RowMapping, now: float, fault: faults.Fault) -> None:
    """End a waiting request faulted at once, with ``fault`` as its last fault."""
    if req["state"] != "waiting":
        return
    conn.execute(
        update(requests)
        .where(requests.c.id == req["id"])
        .values(faults=req["faults"] + 1, fault_rc=fault.rc, fault_message=fault.message)
    )
    _end_request(conn, req["id"], "faulted", now)


def _give_back(
    conn: Connection, req: RowMapping, now: float, rules: Rules, given: faults.JobFault
) -> tuple[bool, bool]:
    """Return a job's slot to its request: requeue it, or fault the request,
    as ``faults.give_back`` decides; returns (requeued, ended).

    ``given.fault`` is kept as the request's last fault, which its status
    shows once the request ends faulted.
    """
    if req["state"] != "waiting":
        return False, False
    back = faults.give_back(req["faults"], req["remaining"], given.counted, rules.max_faults)
    last = {"fault_rc": given.fault.rc, "fault_message": given.fault.message}
    if not back.requeue:
        conn.execute(
            update(requests).where(requests.c.id == req["id"]).values(faults=back.faults, **last)
        )
        _end_request(conn, req["id"], "faulted", now)
        return False, True
    conn.execute(
        update(requests)
        .where(requests.c.id == req["id"])
        .values(
            faults=back.faults,
            restarts=req["restarts"] + 1,
            remaining=req["remaining"] + 1,
            **last,
        )
    )
    if back.enqueue:
        _enqueue(conn, req, RequestView.of(req), now)
    return True, False


def _count_abort(conn: Connection, worker_id: str, now: float, rules: Rules) -> None:
    row = (
        conn.execute(select(workers).where(workers.c.id == worker_id).with_for_update())
        .mappings()
        .one()
    )
    aborts = faults.count_abort(
        row["aborts_in_window"],
        row["abort_window_start"],
        row["maintenance"],
        now,
        rules.maintenance_aborts,
    )
    conn.execute(
        update(workers)
        .where(workers.c.id == worker_id)
        .values(
            aborts_in_window=aborts.in_window,
            abort_window_start=aborts.window_start,
            uncompleted_jobs=row["uncompleted_jobs"] + 1,
            maintenance=aborts.maintenance,
        )
    )


# Timers --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SweepResult:
    expired_jobs: int
    requeued: int
    ended_requests: list[str]
    purged_requests: int
    expired_job_ids: list[str] = dataclasses.field(default_factory=list)


def sweep(
    conn: Connection, now: float, rules: Rules, extended: dict[str, float] | None = None
) -> SweepResult:
    """Expire leases and requests, purge ended requests past retention.

    ``extended`` holds the progress leases of streamed jobs: a job whose
    progress lease still runs has its stored lease moved to that end instead.
    """
    extended = extended or {}
    expired = (
        conn.execute(
            select(jobs)
            .where(jobs.c.state == "processing", jobs.c.lease_expires < now)
            .with_for_update(skip_locked=True)
        )
        .mappings()
        .all()
    )
    requeued = 0
    ended: list[str] = []
    still = [j for j in expired if extended.get(j["id"], 0) >= now]
    for job in still:
        conn.execute(
            update(jobs).where(jobs.c.id == job["id"]).values(lease_expires=extended[job["id"]])
        )
    expired = [j for j in expired if extended.get(j["id"], 0) < now]
    for job in expired:
        # Locks in the order submits take them: job, request, worker.
        conn.execute(update(jobs).where(jobs.c.id == job["id"]).values(state="expired"))
        req = (
            conn.execute(
                select(requests).where(requests.c.id == job["request_id"]).with_for_update()
            )
            .mappings()
            .one()
        )
        was_requeued, was_ended = _give_back(conn, req, now, rules, faults.LEASE_EXPIRY)
        _charge(conn, job["worker_id"], faults.LEASE_EXPIRY.charge, now, rules)
        requeued += was_requeued
        if was_ended:
            ended.append(req["id"])
    stale = (
        conn.execute(
            select(requests.c.id).where(requests.c.state == "waiting", requests.c.expires < now)
        )
        .scalars()
        .all()
    )
    for request_id in stale:
        busy = conn.execute(
            select(jobs.c.id)
            .where(jobs.c.request_id == request_id, jobs.c.state == "processing")
            .limit(1)
        ).first()
        if busy is None:
            _end_request(conn, request_id, "expired", now)
            ended.append(request_id)
    purged = _purge(conn, now - rules.retention)
    _drop_idle_classes(conn, now)
    return SweepResult(len(expired), requeued, ended, purged, [j["id"] for j in expired])


def _drop_idle_classes(conn: Connection, now: float) -> None:
    """Forget queue classes idle for an hour and empty, so chat pops stop visiting them."""
    rows = exists().where(
        queue.c.model == queue_classes.c.model,
        queue.c.kind == queue_classes.c.kind,
        queue.c.features == queue_classes.c.features,
    )
    conn.execute(
        delete(queue_classes).where(queue_classes.c.last_used < now - CLASS_IDLE_SECONDS, ~rows)
    )


def _purge(conn: Connection, before: float) -> int:
    old = select(requests.c.id).where(requests.c.ended < before)
    conn.execute(delete(jobs).where(jobs.c.request_id.in_(old)))
    conn.execute(delete(request_workers).where(request_workers.c.request_id.in_(old)))
    return conn.execute(delete(requests).where(requests.c.ended < before)).rowcount or 0


# Statistics ----------------------------------------------------------------


def model_queue_stats(conn: Connection) -> dict[str, tuple[int, int]]:
    """Per model: (waiting jobs, queued tokens). "" is the any-model queue."""
    rows = conn.execute(
        select(
            queue.c.model,
            # Jobs, not requests: a request with n = 3 waits for 3 jobs.
            func.coalesce(func.sum(requests.c.remaining), 0),
            func.coalesce(func.sum(requests.c.remaining * requests.c.max_length), 0),
        )
        .join(requests, requests.c.id == queue.c.request_id)
        .group_by(queue.c.model)
    ).all()
    return {model: (int(count), int(tokens)) for model, count, tokens in rows}
