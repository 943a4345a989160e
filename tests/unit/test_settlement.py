"""Settlement of a finished job (contract/kudos.py): what the worker's owner
earns, what the requester is charged, and the users' kudos moves."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from hordelite.contract.kudos import (
    MIN_CREDITED_SECONDS,
    KudosMove,
    billed_tokens,
    job_cost,
    job_reward,
    kudos_moves,
    settle,
)
from hordelite.contract.limits import HORDE_TAX_PER_JOB

_chars = st.integers(min_value=0, max_value=200_000)
_max_length = st.integers(min_value=1, max_value=32_768)
_billions = st.floats(min_value=0.0, max_value=1_000.0, allow_nan=False)
_time = st.floats(min_value=0.0, max_value=2e9, allow_nan=False)


def test_a_400_character_reply_on_a_21b_model_earns_100_and_costs_101() -> None:
    paid = settle(400, max_length=512, model_billions=21.0, started=10.0, now=12.5)
    assert (paid.tokens, paid.reward, paid.cost, paid.seconds) == (100, 100.0, 101.0, 2.5)


def test_a_job_settled_as_it_started_is_credited_the_minimum_seconds() -> None:
    assert settle(0, 512, 7.0, started=5.0, now=5.0).seconds == MIN_CREDITED_SECONDS
    # A clock that stepped back does not credit negative time.
    assert settle(0, 512, 7.0, started=5.0, now=4.0).seconds == MIN_CREDITED_SECONDS


@given(_chars, _max_length, _billions, _time, _time)
def test_settle_is_the_text_formula(
    chars: int, max_length: int, billions: float, started: float, now: float
) -> None:
    paid = settle(chars, max_length, billions, started, now)
    assert paid.tokens == billed_tokens(chars, max_length)
    assert paid.reward == job_reward(paid.tokens, billions)
    assert paid.cost == job_cost(paid.reward)
    assert paid.seconds == max(now - started, MIN_CREDITED_SECONDS)
    assert paid.tokens <= max_length
    assert math.isclose(paid.cost - paid.reward, HORDE_TAX_PER_JOB, abs_tol=0.011)


def test_a_requester_paying_another_users_worker_moves_two_users_in_id_order() -> None:
    assert kudos_moves(payer=9, cost=11.0, earner=3, reward=10.0) == [
        KudosMove(3, 10.0, 10.0, 0.0),
        KudosMove(9, -11.0, 0.0, 11.0),
    ]


def test_a_user_paying_their_own_worker_moves_once_and_loses_the_tax() -> None:
    assert kudos_moves(payer=4, cost=11.0, earner=4, reward=10.0) == [
        KudosMove(4, -1.0, 10.0, 11.0)
    ]


_amount = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


@given(st.integers(1, 50), _amount, st.integers(1, 50), _amount)
def test_kudos_moves_add_up_and_are_ordered(
    payer: int, cost: float, earner: int, reward: float
) -> None:
    moves = kudos_moves(payer, cost, earner, reward)
    assert [m.user_id for m in moves] == sorted({payer, earner})
    assert math.isclose(sum(m.delta for m in moves), reward - cost, abs_tol=1e-6)
    assert sum(m.earned for m in moves) == reward
    assert sum(m.paid for m in moves) == cost
