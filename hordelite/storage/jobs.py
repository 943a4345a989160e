"""A worker's answer to a job: a generation, a chat reply, or a fault."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import (
    select,
)

from hordelite.contract import generations, refusals
from hordelite.contract.chat_reply import (
    ChatSubmit,
    Verdict,
    answer_kind,
    output_estimate_chars,
)
from hordelite.contract.text import JobSubmit
from hordelite.errors import HordeError, HordeliteError
from hordelite.storage.accounts import USER_BY_KEY, authenticate
from hordelite.storage.ledger import (
    FINISH_JOB,
    JOB_WITH_REQUEST_LOCKED,
    SubmitResult,
    fault_job,
    settle,
    settlement,
)
from hordelite.storage.rules import Rules
from hordelite.storage.schema import (
    jobs,
    requests,
    users,
)
from hordelite.storage.transaction import Tx


class Unjudged(HordeliteError):
    """A chat reply reached its transaction without a verdict for the job
    found there (the job changed hands between the judging read and the
    write): nothing was written; judge it again and resubmit."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"the reply to job {job_id} was not judged against it")
        self.job_id = job_id


def record_refusal(conn: Tx, key_hash: str, job_id: str, refusal: HordeError) -> None:
    """Record on its chat job a reply refused before it reached the job (a
    malformed structured submit), as the checks against the request record
    theirs: a fault with reply_refused then reports this refusal's message.
    Records nothing for an unknown key, another user's job or a job no longer
    processing; the caller raises the refusal either way."""
    user = conn.execute(USER_BY_KEY, {"key_hash": key_hash}).mappings().first()
    if user is None:
        return
    conn.execute(
        FINISH_JOB.where(
            jobs.c.owner_id == user["id"], jobs.c.state == "processing", jobs.c.kind == "chat"
        ),
        {"job_id": job_id, "refusal_rc": refusal.rc.name, "refusal_message": refusal.message},
    )


def chat_job_to_judge(conn: Tx, key_hash: str, job_id: str) -> tuple[str, dict[str, Any]] | None:
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
    conn: Tx,
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
    judged against this job outside the transaction; a chat reply without
    one for this job and model raises Unjudged (nothing written).
    """
    user = authenticate(conn, key_hash, rules)
    # Locks the job and its request (PostgreSQL), in that order.
    job = conn.execute(JOB_WITH_REQUEST_LOCKED, {"job_id": sub.id}).mappings().first()
    if job is None:
        raise refusals.unknown_job(sub.id)
    refusal = refusals.submit_refusal(
        job["state"],
        job["kind"],
        job["owner_id"] == user["id"],
        max(job["lease_expires"], lease_until or 0),
        now,
        answer_kind(sub),
        sub.state == "faulted",
    )
    if refusal is not None:
        raise refusal
    if sub.state == "faulted":
        reason = sub.fault_reason if isinstance(sub, ChatSubmit) else None
        return fault_job(conn, job, now, rules, reason)
    if isinstance(sub, ChatSubmit):
        return _accept_chat_reply(conn, job, sub, now, billions, verdict, rules)
    too_large = generations.text_refusal(sub.generation, job["request_max_length"])
    if too_large is not None:
        raise too_large
    paid = settlement(job, len(sub.generation), now, billions)
    values = {
        "text": sub.generation,
        "gen_state": sub.state,
        "seed": sub.seed,
        "gen_metadata": sub.gen_metadata,
    }
    stored = generations.text_generation_bytes(sub.generation)
    speed_bound = rules.suspicious_tokens_per_second
    return settle(conn, job, paid, values, now, stored=stored, speed_bound=speed_bound)


def _accept_chat_reply(
    conn: Tx,
    job: Mapping[str, Any],
    sub: ChatSubmit,
    now: float,
    billions: Callable[[str], float],
    verdict: Verdict | None,
    rules: Rules,
) -> SubmitResult:
    if verdict is None or verdict.job_id != job["id"] or verdict.model != job["model"]:
        # Judging is the horde's, outside the transaction: roll back, and
        # let it judge the reply against the job this transaction found.
        raise Unjudged(job["id"])
    reply, refusal = verdict.reply, verdict.refusal
    if reply is not None:
        # The reply as stored, against the bound of what its job asked for.
        refusal = generations.reply_refusal(reply, job["request_max_length"])
    if refusal is not None:
        conn.execute(
            FINISH_JOB,
            {
                "job_id": job["id"],
                "refusal_rc": refusal.rc.name,
                "refusal_message": refusal.message,
            },
        )
        return SubmitResult(0.0, job["request_id"], False, False, refusal)
    assert reply is not None
    paid = settlement(job, output_estimate_chars(reply), now, billions)
    stored = generations.reply_stored_bytes(reply)
    values = {
        "text": reply.content,
        "gen_state": sub.state,
        "reply": reply.to_json(),
        "charge_basis": "output_estimate",
    }
    speed_bound = rules.suspicious_tokens_per_second
    return settle(conn, job, paid, values, now, stored=stored, speed_bound=speed_bound)
