"""Kudos arithmetic of the AI Horde text formula: pure functions."""

from __future__ import annotations

import dataclasses
import math

from hordelite.contract.limits import (
    AGING_PER_SECOND,
    CHARS_PER_TOKEN_PRICING,
    HORDE_TAX_PER_JOB,
    KUDOS_TOKENS_DIVISOR,
    MIN_BILLED_TOKENS,
)


def billed_tokens(text_chars: int, max_length: int) -> int:
    """tokens = min(max_length, max(20, ceil(chars / 4)))."""
    return min(max_length, max(MIN_BILLED_TOKENS, math.ceil(text_chars / CHARS_PER_TOKEN_PRICING)))


def job_reward(tokens: int, model_billions: float) -> float:
    """What a worker's owner earns for a job of ``tokens`` on a model of this size."""
    return round(tokens * model_billions / KUDOS_TOKENS_DIVISOR, 2)


def job_cost(reward: float) -> float:
    """What the requester pays for a job: the reward plus the horde's tax."""
    return round(reward + HORDE_TAX_PER_JOB, 2)


def request_quote(max_length: int, n: int, model_billions: float) -> float:
    """The dry-run price: every job at its full max_length."""
    return round(n * job_cost(job_reward(max_length, model_billions)), 2)


def priority_key(base_priority: float, created: float) -> float:
    """A sort key that ages the request: +50 priority every 10 s of waiting.

    base + 5 x (now - created) orders the queue exactly as
    base - 5 x created does (now is common to every row), so the key is stored
    once and indexed; higher is served first.
    """
    return base_priority - AGING_PER_SECOND * created


@dataclasses.dataclass(frozen=True)
class Settlement:
    """What a finished job moves: the tokens billed, the worker owner's reward,
    the requester's cost, and the seconds the worker is credited with."""

    tokens: int
    reward: float
    cost: float
    seconds: float


# A job submitted in the instant it started still credits its worker a little
# time, so its measured speed (tokens / seconds) stays finite.
MIN_CREDITED_SECONDS = 0.001


def settle(
    chars: int, max_length: int, model_billions: float, started: float, now: float
) -> Settlement:
    """Settle a job of ``chars`` characters of output, started at ``started``
    and settled at ``now``, on a model of ``model_billions``."""
    tokens = billed_tokens(chars, max_length)
    reward = job_reward(tokens, model_billions)
    return Settlement(tokens, reward, job_cost(reward), max(now - started, MIN_CREDITED_SECONDS))


def unread(paid: Settlement, own_worker: bool) -> Settlement:
    """A job settling for a request nobody can read (its OpenAI call is
    gone, decision 0051): the requester is charged nothing; the worker's
    owner is paid for the work turned in, as for any job, unless it is the
    requester, who would otherwise mint kudos by leaving its own calls."""
    return dataclasses.replace(paid, cost=0.0, reward=0.0 if own_worker else paid.reward)


@dataclasses.dataclass(frozen=True)
class KudosMove:
    """One user's change in a settlement: balance, earned total, paid total."""

    user_id: int
    delta: float
    earned: float
    paid: float


def kudos_moves(payer: int, cost: float, earner: int, reward: float) -> list[KudosMove]:
    """The users' changes of a settlement, in user id order (so concurrent
    settlements lock users in the same order and cannot deadlock). A user
    paying their own worker gets one change holding both."""
    changes = {payer: (-cost, 0.0, cost)}
    delta, earned, paid = changes.get(earner, (0.0, 0.0, 0.0))
    changes[earner] = (delta + reward, earned + reward, paid)
    return [KudosMove(user_id, *changes[user_id]) for user_id in sorted(changes)]
