"""The kudos ledger read back from storage, for the fault and ledger tests.

There is no transactions table: each settled job keeps its ``reward`` (paid
to its worker's owner) and its ``cost`` (charged to its requester), and the
users, requests and workers keep running totals. ``ledger_errors`` checks
that they agree: every user's balance is where it started plus the rewards
of the jobs its workers settled minus the costs of its requests' jobs; each
request's kudos are its jobs' costs, each worker's rewards its jobs'
rewards; and each job is priced by the kudos rules on its billed tokens.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping

from sqlalchemy import select

from hordelite.contract import kudos as kudos_rules
from hordelite.storage.schema import jobs, requests, users, workers
from hordelite.storage.transaction import Tx

# Prices are rounded to the hundredth; sums of floats drift far less than this.
TOLERANCE = 1e-6


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE)


def ledger_errors(
    conn: Tx, start: Mapping[int, float], billions: Callable[[str], float]
) -> list[str]:
    """What does not balance, for the users of ``start`` (user id -> kudos at
    creation, with nothing earned or spent then); empty when all does."""
    ids = list(start)
    settled = (
        conn.execute(
            select(
                jobs.c.id,
                jobs.c.owner_id,
                jobs.c.worker_id,
                jobs.c.request_id,
                jobs.c.model,
                jobs.c.tokens,
                jobs.c.reward,
                jobs.c.cost,
                requests.c.user_id.label("requester_id"),
            )
            .join(requests, requests.c.id == jobs.c.request_id)
            .where(
                jobs.c.reward.is_not(None),
                (jobs.c.owner_id.in_(ids)) | (requests.c.user_id.in_(ids)),
            )
        )
        .mappings()
        .all()
    )
    errors: list[str] = []
    earned: dict[int, float] = defaultdict(float)
    spent: dict[int, float] = defaultdict(float)
    by_request: dict[str, float] = defaultdict(float)
    by_worker: dict[str, float] = defaultdict(float)
    for job in settled:
        reward = kudos_rules.job_reward(job["tokens"], billions(job["model"]))
        if not (_same(job["reward"], reward) and _same(job["cost"], kudos_rules.job_cost(reward))):
            errors.append(
                f"job {job['id']}: reward {job['reward']} and cost {job['cost']} for "
                f"{job['tokens']} tokens of {job['model']!r}; the rules say {reward}"
            )
        earned[job["owner_id"]] += job["reward"]
        spent[job["requester_id"]] += job["cost"]
        by_request[job["request_id"]] += job["cost"]
        by_worker[job["worker_id"]] += job["reward"]
    for user in conn.execute(select(users).where(users.c.id.in_(ids))).mappings():
        uid = user["id"]
        expected = start[uid] + earned[uid] - spent[uid]
        if not (
            _same(user["kudos"], expected)
            and _same(user["kudos_earned"], earned[uid])
            and _same(user["kudos_spent"], spent[uid])
        ):
            errors.append(
                f"user {uid}: kudos {user['kudos']} (earned {user['kudos_earned']}, spent "
                f"{user['kudos_spent']}); its jobs say {expected} (earned {earned[uid]}, "
                f"spent {spent[uid]}) from {start[uid]}"
            )
    for req in conn.execute(
        select(requests.c.id, requests.c.kudos).where(requests.c.user_id.in_(ids))
    ).mappings():
        if not _same(req["kudos"], by_request[req["id"]]):
            errors.append(
                f"request {req['id']}: kudos {req['kudos']}, its jobs cost {by_request[req['id']]}"
            )
    for worker in conn.execute(
        select(workers.c.id, workers.c.kudos_rewards).where(workers.c.user_id.in_(ids))
    ).mappings():
        if not _same(worker["kudos_rewards"], by_worker[worker["id"]]):
            errors.append(
                f"worker {worker['id']}: kudos_rewards {worker['kudos_rewards']}, "
                f"its jobs earned {by_worker[worker['id']]}"
            )
    return errors


def settled_jobs(conn: Tx) -> dict[str, tuple[str, float]]:
    """Every settled job: job id -> (state, reward)."""
    rows = conn.execute(
        select(jobs.c.id, jobs.c.state, jobs.c.reward).where(jobs.c.reward.is_not(None))
    )
    return {job_id: (state, reward) for job_id, state, reward in rows}
