"""The slow-worker lease preference (contract/eligibility.py): a chat worker
that cannot generate its own max_length within PREFERRED_SECONDS has its chat
jobs capped while a faster online peer covers everything it can take."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from hordelite.contract.eligibility import (
    WorkerView,
    covers,
    may_be_passed_over,
    passed_over,
    preferred_tokens,
)
from hordelite.contract.limits import PREFERRED_SECONDS
from tests.views import worker_view

# 2 tokens a second (20 tokens in 10 s): 240 tokens within 120 s, short of 512.
SLOW = worker_view(
    id="slow",
    models=(),
    tokens_generated=20.0,
    seconds_generating=10.0,
    prompt_jobs=False,
    chat_model="org/chat",
    chat_features=("tools",),
    chat_mask=0b1,
    chat_max_context_length=4096,
    chat_max_length=512,
)
# 10 tokens a second, the same declaration.
FAST = dataclasses.replace(SLOW, id="fast", tokens_generated=100.0)


def test_a_slow_worker_is_capped_at_what_it_generates_in_the_preferred_time() -> None:
    assert PREFERRED_SECONDS == 120.0
    assert preferred_tokens(SLOW) == 240
    assert may_be_passed_over(SLOW)


def test_a_worker_that_finishes_its_max_length_in_time_is_never_passed_over() -> None:
    assert not may_be_passed_over(FAST)
    assert not passed_over(FAST, [SLOW])


def test_a_text_only_worker_is_never_passed_over() -> None:
    text_only = dataclasses.replace(SLOW, chat_model=None, prompt_jobs=True)
    assert not may_be_passed_over(text_only)
    assert not passed_over(text_only, [FAST])


def test_a_faster_peer_with_the_same_declaration_covers_a_slow_worker() -> None:
    assert covers(FAST, SLOW)
    assert passed_over(SLOW, [FAST])


def test_without_a_covering_peer_a_slow_worker_is_not_passed_over() -> None:
    assert not passed_over(SLOW, [])
    assert not passed_over(SLOW, [SLOW])  # itself
    assert not covers(SLOW, SLOW)


def test_a_peer_that_cannot_take_every_job_the_slow_worker_can_does_not_cover_it() -> None:
    refusing = [
        dataclasses.replace(FAST, maintenance=True),
        dataclasses.replace(FAST, chat_model="org/other"),
        dataclasses.replace(FAST, tokens_generated=20.0),  # not faster
        dataclasses.replace(FAST, chat_mask=0),  # lacks a feature
        dataclasses.replace(FAST, chat_max_length=511),
        dataclasses.replace(FAST, chat_max_context_length=4095),
    ]
    for other in refusing:
        assert not covers(other, SLOW), other
    assert not covers(FAST, dataclasses.replace(SLOW, trusted=True))
    assert not covers(FAST, dataclasses.replace(SLOW, nsfw=True))


def test_a_tools_temperature_limit_covers_only_a_laxer_one() -> None:
    limited = dataclasses.replace(SLOW, tools_max_temperature=0.5)
    assert covers(FAST, limited)  # no limit takes every job
    assert covers(dataclasses.replace(FAST, tools_max_temperature=0.7), limited)
    assert not covers(dataclasses.replace(FAST, tools_max_temperature=0.3), limited)
    assert not covers(dataclasses.replace(FAST, tools_max_temperature=0.7), SLOW)


_workers = st.builds(
    lambda tokens, seconds, max_length, mask, limit, flags: dataclasses.replace(
        SLOW,
        tokens_generated=tokens,
        seconds_generating=seconds,
        chat_max_length=max_length,
        chat_mask=mask,
        tools_max_temperature=limit,
        trusted=flags[0],
        nsfw=flags[1],
        maintenance=flags[2],
    ),
    st.floats(0.0, 1e6, allow_nan=False),
    # No time yet, or at least the least a settlement credits.
    st.just(0.0) | st.floats(0.001, 1e4),
    st.integers(16, 32_768),
    st.integers(0, 0b111),
    st.none() | st.floats(0.0, 2.0),
    st.tuples(st.booleans(), st.booleans(), st.booleans()),
)


@given(_workers)
def test_the_cap_binds_exactly_when_the_worker_may_be_passed_over(worker: WorkerView) -> None:
    assert may_be_passed_over(worker) == (preferred_tokens(worker) < worker.chat_max_length)


@given(_workers, _workers)
def test_covering_is_one_way_and_implies_strictly_faster(a: WorkerView, b: WorkerView) -> None:
    b = dataclasses.replace(b, id="other")
    if covers(a, b):
        assert a.speed > b.speed
        assert not covers(b, a)


@given(_workers, st.lists(_workers, max_size=4))
def test_passed_over_is_slow_and_covered(worker: WorkerView, peers: list[WorkerView]) -> None:
    peers = [dataclasses.replace(p, id=f"peer{i}") for i, p in enumerate(peers)]
    expected = may_be_passed_over(worker) and any(covers(p, worker) for p in peers)
    assert passed_over(worker, peers) == expected
