"""Requests: queue one (text or chat), read its status, cancel it."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.sql import ColumnElement, Select

from hordelite.contract import admission, budgets, refusals
from hordelite.contract import kudos as kudos_rules
from hordelite.contract import shared_keys as key_rules
from hordelite.contract.admission import NewRequest
from hordelite.contract.chat_admission import AdmissionPlan, Capacity
from hordelite.contract.eligibility import (
    REQUEST_FIELDS,
    RequestView,
    WorkerView,
    can_serve,
)
from hordelite.contract.limits import (
    MAX_AGENT_CHARS,
)
from hordelite.errors import RC, HordeError
from hordelite.storage.arrays import one_of
from hordelite.storage.ledger import JOB_WITH_REQUEST_LOCKED, settle, settlement
from hordelite.storage.pool import online_now
from hordelite.storage.queueing import (
    CLIENT_GENERATIONS,
    HELD,
    end_request,
    enqueue,
    get_request,
    release,
)
from hordelite.storage.rules import Rules
from hordelite.storage.schema import (
    ANY_MODEL,
    budget_refusals,
    jobs,
    queue,
    request_workers,
    requests,
    workers,
)
from hordelite.storage.shared_keys import requester, reserved
from hordelite.storage.transaction import Tx, prepared

_INSERT_REQUEST = prepared(insert(requests))


# What a user holds (contract/budgets.py): its generations in flight (the
# concurrency limit), the requests still holding content, and their bytes;
# the anonymous user's, of one client (decision 0071). Read along the
# partial index ix_requests_held_user (ix_requests_held_client), whose
# condition the query must state as a literal (a bound 0 would not match it).
def _holdings_query(by_client: bool) -> Select[Any]:
    return select(
        func.coalesce(
            func.sum(
                case((requests.c.state == "waiting", requests.c.n - requests.c.finished), else_=0)
            ),
            0,
        ).label("in_flight"),
        func.count().label("held"),
        func.coalesce(func.sum(requests.c.held_bytes), 0).label("held_bytes"),
        func.coalesce(func.sum(requests.c.image_bytes), 0).label("image_bytes"),
    ).where(_whose(by_client), requests.c.held_bytes > HELD)


# Requests queued since a moment (requests_per_minute), along
# ix_requests_user_created (ix_requests_client_created), beside the budget
# refusals of the same user or client since then, along
# ix_budget_refusals_who: each counts toward the rate (decision 0071).
def _recent_query(by_client: bool) -> Select[Any]:
    queued = select(
        func.count().label("recent"), func.min(requests.c.created).label("oldest_recent")
    ).where(_whose(by_client), requests.c.created > bindparam("since"))
    refused = select(
        func.count().label("refused"), func.min(budget_refusals.c.at).label("oldest_refused")
    ).where(
        budget_refusals.c.user_id == bindparam("user_id"),
        budget_refusals.c.client == bindparam("client"),
        budget_refusals.c.at > bindparam("since"),
    )
    return _side_by_side(queued, refused)


def _whose(by_client: bool) -> ColumnElement[bool]:
    if by_client:
        return requests.c.client == bindparam("client")
    return requests.c.user_id == bindparam("user_id")


def _side_by_side(*aggregates: Select[*tuple[Any, ...]]) -> Select[Any]:
    """One row of one-row aggregates: one round trip, each read along its
    own index."""
    parts = [a.subquery() for a in aggregates]
    joined = parts[0]
    for part in parts[1:]:
        joined = joined.join(part, true())  # type: ignore[assignment]
    return select(*parts).select_from(joined)


@dataclasses.dataclass(frozen=True)
class _BudgetReads:
    """The budget reads of a user (``by_client`` False) or of one anonymous
    client: the rate, what is held, and both (only what a limit set needs)."""

    recent: Select[Any]
    holdings: Select[Any]
    both: Select[Any]

    @classmethod
    def of(cls, by_client: bool) -> _BudgetReads:
        recent, holdings = _recent_query(by_client), _holdings_query(by_client)
        return cls(
            prepared(recent),
            prepared(holdings),
            prepared(_side_by_side(recent, holdings)),
        )


_BY_USER, _BY_CLIENT = _BudgetReads.of(False), _BudgetReads.of(True)


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
    "image_bytes",
)

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

# A request's status and its jobs held or done, in one statement (one round
# trip, not two: a status read is the commonest read of a busy horde). A row
# per job, the request's columns on each; a request with no such job has one
# row whose job columns are null. Job columns carry a prefix (both tables
# have an id, a kind, a state, a model).
_JOB = "job_"
_REQUEST_STATUS = prepared(
    select(
        *(requests.c[name] for name in dict.fromkeys((*_STATUS_FIELDS, *REQUEST_FIELDS))),
        *(jobs.c[name].label(_JOB + name) for name in _GENERATION_FIELDS),
        workers.c.name.label("worker_name"),
    )
    # Joined flat, a job's worker after the job (a job's worker row is never
    # deleted): a nested "jobs JOIN workers" on the right of the outer join
    # is built whole by SQLite, every job held or done, before the request
    # picks its own.
    .select_from(
        requests.outerjoin(
            jobs,
            and_(
                jobs.c.request_id == requests.c.id,
                # Two equalities, not IN: a literal IN list is expanded at each
                # execution, which the prepared statement's fast path leaves to
                # SQLAlchemy.
                or_(jobs.c.state == "done", jobs.c.state == "processing"),
            ),
        ).outerjoin(workers, workers.c.id == jobs.c.worker_id)
    )
    .where(requests.c.id == bindparam("rid"), requests.c.kind == bindparam("kind"))
    .order_by(jobs.c.submitted)
)


@dataclasses.dataclass(frozen=True)
class Submitted:
    request_id: str
    queued: NewRequest
    view: RequestView
    possible: bool  # an online worker can serve it now
    replayed: bool  # an earlier request with the same operation key
    online: list[WorkerView] | None = None  # the online workers it was checked against


@dataclasses.dataclass(frozen=True)
class Intake:
    """How a request came in, stored with it: the id it is queued under, the
    client agent that sent it, the process holding the OpenAI call that is
    its only reader (None: none), and the address it came from, which an
    anonymous request's budgets are counted by
    (contract.forwarded.client_address)."""

    request_id: str
    client_agent: str
    reader: str | None = None
    client: str | None = None
    # A stored OpenAI Response's record (decision 0078), kept with the
    # request until its purge; None: none.
    response: dict[str, Any] | None = None


def submit_request(
    conn: Tx,
    key_hash: str,
    new: NewRequest,
    request_id: str,
    now: float,
    rules: Rules,
    upfront_max_length: int,
    client_agent: str,
    online: Sequence[WorkerView] | None = None,
    reader: str | None = None,
    client: str | None = None,
) -> Submitted:
    """Queue a request, or find the one an operation key already queued.

    ``online``: the online workers its ``possible`` is checked against, when
    the caller holds them (the service's pool snapshot); read here otherwise.
    ``reader``: the process holding the OpenAI call that is its only reader.
    ``client``: the address it came from, which an anonymous request's
    budgets are counted by (contract.forwarded.client_address).
    Raises InvalidAPIKey, WorkerNotFound, KudosUpfront, TooManyPrompts,
    OperationKeyReused (the key was used for a different request).
    """
    user, shared = requester(conn, key_hash, rules, now, lock=True)
    if new.operation_key is not None:
        operation_key = _scoped(shared, new.operation_key)
        first = _first_request(conn, user, operation_key, new.kind, new.fingerprint)
        if first is not None:
            return Submitted(first.id, new, new.eligibility, True, True)
    held = None if online is None else list(online)
    intake = Intake(request_id, client_agent, reader, client)
    return _store(conn, user, shared, new, held, intake, now, rules, upfront_max_length)


def submit_chat_request(
    conn: Tx,
    key_hash: str,
    plan: AdmissionPlan,
    intake: Intake,
    now: float,
    rules: Rules,
    upfront_max_length: int,
) -> Submitted | FirstRequest | Capacity:
    """A chat submission in one transaction: authenticate, answer a resubmit
    of an operation key with its first request, else admit by ``plan``
    against the online workers read here (its refusals raised) and queue.
    A Capacity instead, with nothing written: the online workers are not the
    ones the plan was worked out for (``AdmissionPlan.under``).
    """
    user, shared = requester(conn, key_hash, rules, now, lock=True)
    if plan.operation_key is not None:
        operation_key = _scoped(shared, plan.operation_key)
        first = _first_request(conn, user, operation_key, "chat", plan.fingerprint)
        if first is not None:
            return first
    # Admission and the possible check read only chat workers: a chat
    # request cannot go to a worker without a chat declaration.
    online = online_now(conn, now, chat=True)
    new = plan.under(online)
    if isinstance(new, Capacity):
        return new
    return _store(conn, user, shared, new, online, intake, now, rules, upfront_max_length)


@dataclasses.dataclass(frozen=True)
class FirstRequest:
    """The request a user first queued under an operation key (a resubmit
    answers it)."""

    id: str
    max_length: int
    models: tuple[str, ...]


def first_request(
    conn: Tx,
    key_hash: str,
    operation_key: str,
    kind: str,
    fingerprint: str | None,
    rules: Rules,
) -> FirstRequest | None:
    """The request the key's user queued under ``operation_key``, None when
    there is none; raises InvalidAPIKey, and OperationKeyReused when that was
    a different request."""
    user, shared = requester(conn, key_hash, rules, None)
    return _first_request(conn, user, _scoped(shared, operation_key), kind, fingerprint)


def _scoped(shared: Mapping[str, Any] | None, operation_key: str) -> str:
    """The operation key a request is stored under: a shared key's own
    (contract.shared_keys.operation_key_of), else the user's as sent."""
    if shared is None:
        return operation_key
    return key_rules.operation_key_of(shared["key_hash"], operation_key)


def _first_request(
    conn: Tx, user: Mapping[str, Any], operation_key: str, kind: str, fingerprint: str | None
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
    conn: Tx,
    user: Mapping[str, Any],
    shared: Mapping[str, Any] | None,
    new: NewRequest,
    online: list[WorkerView] | None,
    intake: Intake,
    now: float,
    rules: Rules,
    upfront_max_length: int,
) -> Submitted:
    """Check what storing needs (worker ids, kudos up front, concurrency, a
    shared key's limits) and queue the request; ``shared``: the shared key it
    was sent with; ``online`` saves reading the online workers again."""
    request_id = intake.request_id
    listed = new.eligibility.worker_ids
    if listed:
        found = set(conn.execute(select(workers.c.id).where(workers.c.id.in_(listed))).scalars())
        missing = [w for w in listed if w not in found]
        if missing:
            raise refusals.unknown_listed_worker(missing[0])
    new = _check_upfront(new, user, upfront_max_length)
    if shared is not None:
        key_rules.check_request(
            shared["kudos"],
            reserved(conn, shared),
            shared["max_text_tokens"],
            new.max_length,
            new.held,
        )
    counted_as = budget_client(user, intake.client)
    _check_budgets(conn, user, new, now, rules, counted_as)
    view = new.eligibility
    row = _request_row(new, user, request_id, now, rules, intake.client_agent)
    row["reader"] = intake.reader
    row["client"] = counted_as or None
    row["response"] = intake.response
    # A Response's record is kept until the purge, as a generation is: its
    # bytes count in its requester's stored bytes as a generation's do
    # (decision 0069), from its release to its purge.
    row["generation_bytes"] = _json_bytes(intake.response) if intake.response else 0
    row["shared_key"] = row["shared_price"] = None
    if shared is not None:
        # Its price is held on the key from now on (contract.shared_keys).
        row["shared_key"] = shared["key_hash"]
        row["shared_price"] = key_rules.job_price(new.held, new.n)
        if new.operation_key is not None:
            row["operation_key"] = _scoped(shared, new.operation_key)
    conn.defer(_INSERT_REQUEST, row)
    if listed:
        conn.execute(
            insert(request_workers),
            [{"request_id": request_id, "worker_id": w} for w in listed],
        )
    enqueue(conn, row, view, now)
    if online is None:
        online = online_now(conn, now)
    possible = any(can_serve(w, view) for w in online)
    return Submitted(request_id, new, view, possible, False, online)


def _request_row(
    new: NewRequest,
    user: Mapping[str, Any],
    request_id: str,
    now: float,
    rules: Rules,
    client_agent: str,
) -> dict[str, Any]:
    """The requests row of a request queued now by ``user``."""
    return {
        **_eligibility_columns(new.eligibility),
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
        "held_bytes": max(1, new.held_bytes),
        "image_bytes": new.image_bytes,
    }


def _eligibility_columns(view: RequestView) -> dict[str, Any]:
    """The requests columns of a view (REQUEST_FIELDS; sequences as JSON lists)."""
    columns = {name: getattr(view, name) for name in REQUEST_FIELDS}
    return {**columns, "models": list(view.models), "worker_ids": list(view.worker_ids)}


def _check_upfront(new: NewRequest, user: Mapping[str, Any], upfront_max_length: int) -> NewRequest:
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


def budget_client(user: Mapping[str, Any], client: str | None) -> str:
    """Whom a request's budgets count: "" for a registered user (its own),
    the client's address for the anonymous user (decision 0071); "" too for
    an anonymous request whose address is unknown (an in-process call)."""
    return (client or "") if user["anonymous"] else ""


def _check_budgets(
    conn: Tx,
    user: Mapping[str, Any],
    new: NewRequest,
    now: float,
    rules: Rules,
    client: str,
) -> None:
    """The user's budgets and concurrency limit against what it holds now
    (the anonymous user's: what this ``client`` holds), read here (only what
    a limit set needs): raises the first refusal."""
    budget = rules.budgets.of(
        anonymous=user["anonymous"], trusted=user["trusted"], admin=user["admin"]
    )
    role = budgets.role_of(anonymous=user["anonymous"], trusted=user["trusted"])
    limit = admission.concurrency_limit(
        user["concurrency"], user["anonymous"], rules.concurrency, rules.anonymous_concurrency
    )
    rate = budget is not None and bool(budget.requests_per_minute)
    holding = not admission.unlimited(limit) or (budget is not None and budget.counts_held)
    reads = _BY_CLIENT if user["anonymous"] else _BY_USER
    params = {
        "user_id": user["id"],
        "client": client,
        "since": now - budgets.RATE_WINDOW_SECONDS,
    }
    row: Mapping[str, Any] = {}
    if rate and holding:
        row = conn.execute(reads.both, params).mappings().one()
    elif rate:
        row = conn.execute(reads.recent, params).mappings().one()
    elif holding:
        row = conn.execute(reads.holdings, params).mappings().one()
    in_flight = int(row.get("in_flight", 0))
    refusal = budgets.refusal(
        budget, role, _holdings(row, _generations(conn, user, client, holding)), new.cost, now
    )
    if refusal is not None:
        raise refusal
    if admission.over_limit(in_flight, new.n, limit):
        raise refusals.too_many_in_flight(in_flight, limit, anonymous=user["anonymous"])


def _generations(conn: Tx, user: Mapping[str, Any], client: str, holding: bool) -> int:
    """The bytes of the generations the user's released requests keep
    until their purge (decision 0069); the anonymous user's, of ``client``
    (decision 0071): read only when a held budget is checked."""
    if not user["anonymous"]:
        return int(user["generation_bytes"])
    if not holding or not client:
        return 0
    stored = conn.execute(CLIENT_GENERATIONS, {"client": client}).scalar()
    return int(stored or 0)


def _holdings(row: Mapping[str, Any], generation_bytes: int = 0) -> budgets.Holdings:
    """A budget read's row as Holdings: the requests and refusals of the
    window counted together, from the oldest of either; ``generation_bytes``
    held besides (``_generations``)."""
    oldest = [t for t in (row.get("oldest_recent"), row.get("oldest_refused")) if t is not None]
    return budgets.Holdings(
        recent=int(row.get("recent", 0)) + int(row.get("refused", 0)),
        oldest_recent=min(oldest) if oldest else None,
        held=int(row.get("held", 0)),
        held_bytes=int(row.get("held_bytes", 0)) + generation_bytes,
        image_bytes=int(row.get("image_bytes", 0)),
    )


def _rate_refusal(
    conn: Tx, user: Mapping[str, Any], budget: budgets.Budget, client: str, now: float
) -> HordeError | None:
    """The user's (its anonymous ``client``'s) requests_per_minute refusal
    now, or None: one indexed read."""
    reads = _BY_CLIENT if user["anonymous"] else _BY_USER
    params = {"user_id": user["id"], "client": client, "since": now - budgets.RATE_WINDOW_SECONDS}
    row = conn.execute(reads.recent, params).mappings().one()
    role = budgets.role_of(anonymous=user["anonymous"], trusted=user["trusted"])
    return budgets.rate_refusal(budget, role, _holdings(row), now)


def count_refusal(conn: Tx, key_hash: str, client: str | None, now: float, rules: Rules) -> None:
    """A budget refusal of the key's request, counted toward its user's (or
    anonymous client's) requests_per_minute as a request would be (decision
    0071); nothing for a user without a rate (an admin, or a budget of 0)."""
    user, _ = requester(conn, key_hash, rules, now)
    budget = rules.budgets.of(
        anonymous=user["anonymous"], trusted=user["trusted"], admin=user["admin"]
    )
    if budget is None or not budget.requests_per_minute:
        return
    conn.execute(
        insert(budget_refusals).values(
            user_id=user["id"], client=budget_client(user, client), at=now
        )
    )


def forget_refusals(conn: Tx, now: float) -> None:
    """The budget refusals no window counts any more (each sweep)."""
    conn.execute(
        delete(budget_refusals).where(budget_refusals.c.at <= now - budgets.RATE_WINDOW_SECONDS)
    )


@dataclasses.dataclass(frozen=True)
class ImageHoldings:
    """Who a request with images is queued for, and the image bytes its
    requests hold now (0 when its budget sets no image limit: not read).
    ``client``: whom its budgets count (``budget_client``)."""

    user_id: int
    anonymous: bool
    trusted: bool
    admin: bool
    image_bytes: int
    client: str = ""

    @property
    def account(self) -> tuple[int, str]:
        """Whose image intakes count together, and take turns: a user, or
        one anonymous client address (decision 0071)."""
        return (self.user_id, self.client)


def image_holdings(
    conn: Tx, key_hash: str, client: str | None, now: float, rules: Rules
) -> ImageHoldings:
    """The key's user (a shared key's lender) and its held image bytes (an
    anonymous client's), read before an image is taken in; raises as
    ``requester``, and its requests_per_minute refusal: a request whose
    taking in is costly (its images fetched and decoded) passes the rate
    first, so that a flood of them past a budget costs this one read each
    (decision 0071). The other budgets are checked where it is stored."""
    user, _ = requester(conn, key_hash, rules, None)
    budget = rules.budgets.of(
        anonymous=user["anonymous"], trusted=user["trusted"], admin=user["admin"]
    )
    counted_as = budget_client(user, client)
    if budget is not None and budget.requests_per_minute:
        refusal = _rate_refusal(conn, user, budget, counted_as, now)
        if refusal is not None:
            raise refusal
    held = 0
    if budget is not None and budget.image_bytes:
        # The holdings' read (its image bytes), along the same partial index.
        reads = _BY_CLIENT if user["anonymous"] else _BY_USER
        params = {"user_id": user["id"], "client": counted_as}
        held = int(conn.execute(reads.holdings, params).mappings().one()["image_bytes"])
    return ImageHoldings(
        user["id"],
        bool(user["anonymous"]),
        bool(user["trusted"]),
        bool(user["admin"]),
        held,
        counted_as,
    )


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
    image_bytes: int  # of its stored images, until they are released

    @property
    def kind(self) -> str:
        return self.view.kind

    @property
    def queued(self) -> bool:
        """Waiting for a worker to take a job (not only for jobs in progress)."""
        return self.state == "waiting" and self.remaining > 0

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> StoredRequest:
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
    def of(cls, row: Mapping[str, Any]) -> StoredJob:
        return cls(
            worker_name=row["worker_name"],
            **{name: row[_JOB + name] for name in _GENERATION_FIELDS},
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
    # Kudos a cancel's settlement of streamed jobs moved: (rewarded, charged).
    settled: tuple[float, float] = (0.0, 0.0)


def request_status(
    conn: Tx,
    request_id: str,
    kind: str,
    now: float,
    rules: Rules,
    with_position: bool = True,
    with_busy: bool = False,
    pool: Sequence[WorkerView] | None = None,
) -> StatusSnapshot:
    """The parts of a status answer (the service renders them).

    ``with_position`` False skips the queue position (a count that follows
    the position): a waiting OpenAI call re-checking its request needs only
    whether it ended and whether it is possible. ``with_busy`` adds
    ``busy``: the jobs in progress of each online worker. ``pool``: the
    online workers, when the caller holds them (read here otherwise).
    """
    req, gens = _request_and_jobs(conn, request_id, kind)
    # Once every job is in a worker's hands, eligibility and the queue ahead
    # no longer matter: the status skips both reads.
    queued = req.queued
    # A chat request can only go to a chat worker of one of its models, and
    # its status reads nothing else of the pool (eligibility, the impossible
    # reason): read just those, not every online text worker.
    chat = req.kind == "chat"
    if not queued:
        online: list[WorkerView] = []
    elif pool is None:
        online = online_now(conn, now, chat=chat, models=req.view.models)
    elif chat:
        online = [w for w in pool if w.chat_model is not None and w.chat_model in req.view.models]
    else:
        online = list(pool)
    position = _queue_position(conn, req) if with_position and queued else 0
    busy = _busy(conn, [w.id for w in online]) if with_busy and queued else None
    return StatusSnapshot(req, gens, tuple(online), position, busy)


def _request_and_jobs(
    conn: Tx, request_id: str, kind: str
) -> tuple[StoredRequest, tuple[StoredJob, ...]]:
    """The request and its jobs held or done (one statement, _REQUEST_STATUS)."""
    rows = conn.execute(_REQUEST_STATUS, {"rid": request_id, "kind": kind}).mappings().all()
    if not rows:
        raise refusals.unknown_request(kind, request_id)
    jobs_found = tuple(StoredJob.of(row) for row in rows if row[_JOB + "id"] is not None)
    return StoredRequest.of(rows[0]), jobs_found


def _busy(conn: Tx, worker_ids: list[str]) -> dict[str, int]:
    """Jobs in progress per worker, for these workers (read along
    ix_jobs_state_lease). The ids are the pool's, as many as it holds: one
    parameter (storage.arrays)."""
    if not worker_ids:
        return {}
    rows = conn.execute(
        select(jobs.c.worker_id, func.count())
        .where(jobs.c.state == "processing", one_of(conn, jobs.c.worker_id, worker_ids))
        .group_by(jobs.c.worker_id)
    )
    return {worker_id: int(count) for worker_id, count in rows}


def _queue_position(conn: Tx, req: StoredRequest) -> int:
    """Waiting requests ahead of this one that compete for its models.

    Read along ix_queue_order (one range per model), so the cost follows the
    position, not the length of the queue.
    """
    anon, key = req.anonymous, req.prio_key
    models = req.view.models
    params: dict[str, Any] = {f"m{i}": m for i, m in enumerate(models)}
    ahead = conn.execute(_position_statement(len(models), anon), {**params, "key": key})
    count = int(ahead.scalar_one())
    if anon:  # every registered request comes first
        count += int(conn.execute(_position_statement(len(models), None), params).scalar_one())
    return count


@functools.lru_cache(maxsize=512)
def _position_statement(models: int, anonymous: bool | None) -> Select[Any]:
    """The count of waiting requests ahead, for a request naming ``models``
    models (0: any model, so every waiting request competes): of the same
    ``anonymous`` class with a higher ``prio_key`` (bound as ``key``), or
    with None, every registered request. The models are bound one by one
    (``m0``, ``m1``...), not as an IN list, which SQLAlchemy would expand
    at each run (the prepared statements' fast path leaves that to it)."""
    if models:
        table, rid = queue, queue.c.request_id
        names = [queue.c.model == bindparam(f"m{i}") for i in range(models)]
        where: list[ColumnElement[bool]] = [or_(*names, queue.c.model == ANY_MODEL)]
    else:
        table, rid = requests, requests.c.id
        where = [requests.c.state == "waiting", requests.c.remaining > 0]
    if anonymous is None:
        where.append(table.c.anonymous.is_(False))
    else:
        where += [table.c.anonymous == anonymous, table.c.prio_key > bindparam("key")]
    return prepared(select(func.count(func.distinct(rid))).where(*where))


def cancel_request(
    conn: Tx,
    request_id: str,
    kind: str,
    now: float,
    rules: Rules,
    posted: dict[str, int] | None = None,
    billions: Callable[[str], float] | None = None,
    unread: bool = False,
    orphaned: bool = False,
) -> StatusSnapshot:
    """End a waiting request; returns its status parts as they were before.

    ``posted`` maps the request's streamed jobs to the characters of content
    and reasoning their workers posted: each is settled on them (the worker
    rewarded, the requester charged, no dropped job). A job that does not
    stream is not settled. ``unread``: nobody can read the reply (its
    OpenAI call is gone): a job still out that settles later charges the
    requester nothing (decision 0051). ``orphaned`` (implies ``unread``):
    the process that held the call is gone (killed, or its reader lease
    lapsed), so nothing says its client got the text posted: the streamed
    jobs too are settled as an unread request's, charging nothing, as a
    horde whose leases died with the process settles them (decision 0073).
    """
    status = request_status(conn, request_id, kind, now, rules)
    req = status.request
    rewarded = charged = 0.0
    settled_ids: set[str] = set()
    if req.state == "waiting":
        if orphaned:
            # Marked before the settlements below, which read it (ledger.settlement).
            conn.execute(update(requests).where(requests.c.id == req.id).values(unread=True))
        for job_id, chars in (posted or {}).items():
            job = conn.execute(JOB_WITH_REQUEST_LOCKED, {"job_id": job_id}).mappings().first()
            if job is None or job["state"] != "processing" or billions is None:
                continue
            paid = settlement(job, chars, now, billions)
            settled = settle(conn, job, paid, {"charge_basis": "output_estimate"}, now, "cancelled")
            rewarded += settled.reward
            charged += settled.cost
            settled_ids.add(job_id)
        end_request(conn, req.id, "cancelled", now, abort_jobs=False)
        if unread and not orphaned:
            conn.execute(update(requests).where(requests.c.id == req.id).values(unread=True))
        if not any(j.state == "processing" and j.id not in settled_ids for j in status.jobs):
            # No job still out needs its content: released at once (a job
            # still out is judged against it; the sweep releases it later).
            release(conn, [req.id])
    return dataclasses.replace(status, settled=(rewarded, charged))


def _json_bytes(value: Any) -> int:
    """The bytes ``value`` takes stored as JSON (UTF-8)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


_STORED_RESPONSE = prepared(
    select(requests.c.response).where(requests.c.id == bindparam("rid"), requests.c.kind == "chat")
)
_FORGET_RESPONSE = prepared(
    update(requests).where(requests.c.id == bindparam("rid")).values(response=None)
)


def stored_response(conn: Tx, request_id: str) -> dict[str, Any] | None:
    """The record a stored Response keeps with its chat request (decision
    0078); None when there is none (no such request, not a Response, sent
    with store: false, deleted, or purged)."""
    value = conn.execute(_STORED_RESPONSE, {"rid": request_id}).scalar()
    return dict(value) if value else None


def forget_response(conn: Tx, request_id: str) -> None:
    """Drop a stored Response's record. Its bytes stay counted until the
    request's purge, as the request's own row does."""
    conn.execute(_FORGET_RESPONSE, {"rid": request_id})


@dataclasses.dataclass(frozen=True)
class SubmittedText:
    """A text request as it was queued (its prompt ``""`` once released
    after it ended), for its requester."""

    prompt: str
    params: dict[str, Any]
    models: list[str]
    worker_ids: list[str]
    worker_blacklist: bool
    trusted_workers: bool
    slow_workers: bool
    softprompt: str | None
    proxied_account: str | None
    webhook: str | None


def submitted_text(conn: Tx, key_hash: str, request_id: str, rules: Rules) -> SubmittedText:
    """The text request ``request_id`` as queued, for the user who queued it
    (or an admin): its prompt is the requester's, not every reader's. A
    shared key reads the requests queued through it, and no other of its
    lender's."""
    user, shared = requester(conn, key_hash, rules, None)
    row = get_request(conn, request_id, "text")
    if shared is not None:
        allowed = row["shared_key"] == shared["key_hash"]
    else:
        allowed = row["user_id"] == user["id"] or bool(user["admin"])
    if not allowed:
        raise HordeError(RC.WrongCredentials, "Only the user who queued this request can read it.")
    return SubmittedText(
        prompt=row["prompt"],
        params=row["params"],
        models=list(row["models"]),
        worker_ids=list(row["worker_ids"]),
        worker_blacklist=bool(row["worker_blacklist"]),
        trusted_workers=bool(row["trusted_workers"]),
        slow_workers=bool(row["slow_workers"]),
        softprompt=row["softprompt"],
        proxied_account=row["proxied_account"],
        webhook=row["webhook"],
    )
