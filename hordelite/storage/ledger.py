"""What a finished or given-back job moves: settlement, kudos, worker counters, faults."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import (
    Table,
    bindparam,
    select,
    update,
)
from sqlalchemy.sql import Update

from hordelite.contract import faults
from hordelite.contract import kudos as kudos_rules
from hordelite.contract.eligibility import (
    RequestView,
)
from hordelite.contract.unicode_rules import unsendable
from hordelite.errors import HordeError
from hordelite.storage import suspicion
from hordelite.storage.queueing import end_request, enqueue, get_request, hook_due_at
from hordelite.storage.rules import Rules
from hordelite.storage.schema import (
    jobs,
    requests,
    users,
    workers,
)
from hordelite.storage.shared_keys import spend
from hordelite.storage.transaction import Tx, prepared

JOB_WITH_REQUEST = prepared(
    select(
        jobs,
        requests.c.user_id.label("requester_id"),
        requests.c.state.label("request_state"),
        requests.c.n,
        requests.c.finished,
        requests.c.max_length.label("request_max_length"),
        requests.c.created.label("request_created"),
        requests.c.unread.label("request_unread"),
        requests.c.shared_key.label("request_shared_key"),
        requests.c.webhook.is_not(None).label("request_has_webhook"),
    )
    .join(requests, requests.c.id == jobs.c.request_id)
    .where(jobs.c.id == bindparam("job_id"))
)

# Locks the job and its request (PostgreSQL), in that order.
JOB_WITH_REQUEST_LOCKED = prepared(JOB_WITH_REQUEST.with_for_update())

FINISH_JOB = prepared(update(jobs).where(jobs.c.id == bindparam("job_id")))


def _increment(table: Table, key: str, **by: str | int) -> Update:
    """An UPDATE of the row of ``table`` whose id is the parameter ``key``,
    adding to each column of ``by`` its parameter (named) or a constant."""
    return prepared(
        update(table)
        .where(table.c.id == bindparam(key))
        .values(
            {
                column: table.c[column] + (bindparam(value) if isinstance(value, str) else value)
                for column, value in by.items()
            }
        )
    )


_MOVE_KUDOS = _increment(users, "uid", kudos="delta", kudos_earned="earned", kudos_spent="paid")

_CREDIT_WORKER = _increment(
    workers,
    "wid",
    kudos_rewards="reward",
    requests_fulfilled=1,
    tokens_generated="tokens",
    seconds_generating="seconds",
)

# A job done: its request counts it, adds what it paid and the bytes its
# generation stores (decision 0069: its user counts them once the request is
# released; until then the request's reservation covers them).
_FINISH_REQUEST = _increment(requests, "rid", finished=1, kudos="cost", generation_bytes="stored")

_FINISH_LAST = prepared(
    _FINISH_REQUEST.values(
        state="done", ended=bindparam("now"), remaining=0, hook_due=hook_due_at(bindparam("now"))
    )
)


@dataclasses.dataclass(frozen=True)
class SubmitResult:
    reward: float
    request_id: str
    request_ended: bool  # done or faulted: waiters can be told
    requeued: bool  # a faulted job went back to the queue
    # A refused chat reply: recorded on the job (a later fault counts by it),
    # then raised by the service once this transaction has committed.
    refusal: HordeError | None = None
    # What the settlement charged the requester (its worker's owner got
    # ``reward``); for the metrics.
    cost: float = 0.0
    # The request's kind and creation time, when this submit made it done
    # (its submit-to-done latency).
    done_kind: str | None = None
    created: float = 0.0
    # Whether ending the request owed its webhook a call: the process's
    # webhook task is woken only then, not at every request's end.
    hook_owed: bool = True


def settlement(
    job: Mapping[str, Any], chars: int, now: float, billions: Callable[[str], float]
) -> kudos_rules.Settlement:
    """What the job of this row (JOB_WITH_REQUEST) moves for ``chars``
    characters of output; for a request nobody can read, no charge
    (``kudos.unread``)."""
    paid = kudos_rules.settle(
        chars, job["request_max_length"], billions(job["model"]), job["started"], now
    )
    if job["request_unread"]:
        return kudos_rules.unread(paid, own_worker=job["owner_id"] == job["requester_id"])
    return paid


def settle(
    conn: Tx,
    job: Mapping[str, Any],
    paid: kudos_rules.Settlement,
    values: dict[str, Any],
    now: float,
    state: str = "done",
    stored: int = 0,
    speed_bound: float = 0.0,  # past it, its worker is suspected (_credit_worker)
) -> SubmitResult:
    """Store a finished job: reward its worker's owner, charge the requester,
    with the amounts of ``paid``; ``stored``: its generation's bytes.

    A job settled at a cancel ends ``cancelled``: paid, not a generation;
    so does one of a request nobody can read (decision 0051), whose reply is
    not kept: nobody could read it, so nobody gets to.
    """
    if job["request_unread"]:
        state, values = "cancelled", {"charge_basis": values.get("charge_basis")}
    tokens, reward, cost = paid.tokens, paid.reward, paid.cost
    # Its writes are deferred (Tx.defer): on PostgreSQL they go with the COMMIT.
    conn.defer(
        FINISH_JOB,
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
    move_kudos(conn, payer=job["requester_id"], cost=cost, earner=job["owner_id"], reward=reward)
    if job["request_shared_key"] is not None:
        spend(conn, job["request_shared_key"], cost)  # what the lent key paid
    _credit_worker(conn, job["worker_id"], paid, now, speed_bound if state == "done" else 0.0)
    if state != "done":
        conn.execute(
            update(requests)
            .where(requests.c.id == job["request_id"])
            .values(kudos=requests.c.kudos + cost)
        )
        return SubmitResult(reward, job["request_id"], False, False, cost=cost)
    # The job's row read the request's counts and state under its lock
    # (JOB_WITH_REQUEST): whether this job is the last is known here, so the
    # request is counted and, if so, ended in one statement. A cancelled
    # request stays cancelled when its last job comes in.
    done = job["finished"] + 1 >= job["n"]
    ends = done and job["request_state"] == "waiting"
    _finish_request(conn, job, ends, cost, now, stored)
    return SubmitResult(
        reward,
        job["request_id"],
        done,
        False,
        cost=cost,
        done_kind=job["kind"] if ends else None,
        created=job["request_created"] if ends else 0.0,
        hook_owed=ends and bool(job["request_has_webhook"]),
    )


def _credit_worker(
    conn: Tx, worker_id: str, paid: kudos_rules.Settlement, now: float, speed_bound: float
) -> None:
    """The worker's counters of a settled job; a job done faster than
    ``speed_bound`` tokens a second ([moderation]
    suspicious_tokens_per_second; 0: not judged, as a cancel's settlement
    is not) adds to its suspicion (hordelite.storage.suspicion)."""
    credit = {"reward": paid.reward, "tokens": paid.tokens, "seconds": paid.seconds}
    conn.defer(_CREDIT_WORKER, {"wid": worker_id, **credit})
    suspicion.judge_speed(conn, worker_id, paid.tokens, paid.seconds, speed_bound, now)


def _finish_request(
    conn: Tx, job: Mapping[str, Any], ends: bool, cost: float, now: float, stored: int
) -> None:
    """Count a done job on its request (ending it when ``ends``), with its
    generation's bytes (decision 0069)."""
    finish = _FINISH_LAST if ends else _FINISH_REQUEST
    conn.defer(finish, {"rid": job["request_id"], "cost": cost, "now": now, "stored": stored})


def move_kudos(conn: Tx, payer: int, cost: float, earner: int, reward: float) -> None:
    for move in kudos_rules.kudos_moves(payer, cost, earner, reward):
        conn.defer(
            _MOVE_KUDOS,
            {"uid": move.user_id, "delta": move.delta, "earned": move.earned, "paid": move.paid},
        )


def fault_job(
    conn: Tx, job: Mapping[str, Any], now: float, rules: Rules, reason: str | None
) -> SubmitResult:
    """A job the worker gave up on: back to the queue, or the request faults,
    as ``faults.job_fault`` decides."""
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job["id"])
        .values(state="faulted", submitted=now, gen_state="faulted", fault_reason=reason)
    )
    req = get_request(conn, job["request_id"], job["kind"])
    decision = faults.job_fault(
        reason, job["refusal_rc"], job["refusal_message"], holds_unsendable(req)
    )
    if decision.end_request:
        fault_request(conn, req, now, decision.fault)
        return SubmitResult(0.0, req["id"], True, False)
    charge_worker(conn, job["worker_id"], decision.charge, now, rules)
    requeued, ended = give_back(conn, req, now, rules, decision)
    return SubmitResult(0.0, req["id"], ended, requeued)


def charge_worker(
    conn: Tx, worker_id: str, charge: faults.Charge, now: float, rules: Rules
) -> None:
    """Add a job given back to the worker counter ``charge`` names."""
    if charge == "nonconformant":
        conn.execute(
            update(workers)
            .where(workers.c.id == worker_id)
            .values(nonconformant_replies=workers.c.nonconformant_replies + 1)
        )
    elif charge == "abort":
        count_abort(conn, worker_id, now, rules)


def holds_unsendable(req: Mapping[str, Any]) -> bool:
    """The request's text or parameters hold what no worker can encode."""
    return unsendable([req["prompt"], req["params"], req["chat"]]) is not None


def fault_request(conn: Tx, req: Mapping[str, Any], now: float, fault: faults.Fault) -> None:
    """End a waiting request faulted at once, with ``fault`` as its last fault."""
    if req["state"] != "waiting":
        return
    conn.execute(
        update(requests)
        .where(requests.c.id == req["id"])
        .values(faults=req["faults"] + 1, fault_rc=fault.rc, fault_message=fault.message)
    )
    end_request(conn, req["id"], "faulted", now)


def lapse_job(conn: Tx, job: Mapping[str, Any], now: float, rules: Rules) -> tuple[bool, bool]:
    """End a job in hand as a lease that ran out (its worker cannot submit
    it: the lease lapsed, or the worker was deleted) and give its slot back
    to its request, locked after the job, as submits lock them; returns
    (requeued, ended) as ``give_back``."""
    conn.execute(update(jobs).where(jobs.c.id == job["id"]).values(state="expired"))
    req = (
        conn.execute(select(requests).where(requests.c.id == job["request_id"]).with_for_update())
        .mappings()
        .one()
    )
    return give_back(conn, req, now, rules, faults.LEASE_EXPIRY)


def give_back(
    conn: Tx, req: Mapping[str, Any], now: float, rules: Rules, given: faults.JobFault
) -> tuple[bool, bool]:
    """Return a job's slot to its request: requeue it, or fault the request,
    as ``faults.give_back`` decides; returns (requeued, ended).

    ``given.fault`` is kept as the request's last fault, which its status
    shows once the request ends faulted.
    """
    if req["state"] != "waiting":
        return False, False
    back = faults.give_back(req["faults"], req["remaining"], rules.max_faults)
    last = {"fault_rc": given.fault.rc, "fault_message": given.fault.message}
    if not back.requeue:
        conn.execute(
            update(requests).where(requests.c.id == req["id"]).values(faults=back.faults, **last)
        )
        end_request(conn, req["id"], "faulted", now)
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
        enqueue(conn, req, RequestView.of(req), now)
    return True, False


def count_abort(conn: Tx, worker_id: str, now: float, rules: Rules) -> None:
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
