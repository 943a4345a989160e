"""Kudos arithmetic of the AI Horde text formula: pure functions."""

from __future__ import annotations

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
