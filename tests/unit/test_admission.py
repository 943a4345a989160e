"""Whether an account may queue a request (contract/admission.py): kudos up
front and the concurrency limit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hordelite.contract.admission import concurrency_limit, over_limit, unlimited, upfront


def test_a_request_within_the_free_max_length_needs_no_kudos() -> None:
    assert upfront(512, 512, quote=99.0, kudos=0.0, anonymous=True, can_downgrade=False) == (
        "accepted"
    )


def test_a_named_account_with_the_quote_pays_up_front() -> None:
    assert upfront(1024, 512, 50.0, 50.0, anonymous=False, can_downgrade=False) == "accepted"


def test_the_anonymous_account_never_pays_up_front() -> None:
    assert upfront(1024, 512, 50.0, 1e9, anonymous=True, can_downgrade=False) == "refused"
    assert upfront(1024, 512, 50.0, 1e9, anonymous=True, can_downgrade=True) == "downgrade"


def test_short_of_the_quote_a_request_is_downgraded_if_it_allows_it_else_refused() -> None:
    assert upfront(1024, 512, 50.0, 49.99, False, can_downgrade=True) == "downgrade"
    assert upfront(1024, 512, 50.0, 49.99, False, can_downgrade=False) == "refused"


@given(
    st.integers(1, 4096),
    st.integers(1, 4096),
    st.floats(0, 1e4),
    st.floats(-1e4, 1e4),
    st.booleans(),
    st.booleans(),
)
def test_upfront_accepts_exactly_the_free_or_paid_requests(
    max_length: int, free: int, quote: float, kudos: float, anonymous: bool, downgrade: bool
) -> None:
    decision = upfront(max_length, free, quote, kudos, anonymous, downgrade)
    paid = max_length <= free or (kudos >= quote and not anonymous)
    assert (decision == "accepted") == paid
    if not paid:
        assert decision == ("downgrade" if downgrade else "refused")


def test_an_accounts_own_limit_wins_over_the_configured_ones() -> None:
    assert concurrency_limit(7, anonymous=True, concurrency=3, anonymous_concurrency=1) == 7
    assert concurrency_limit(None, anonymous=True, concurrency=3, anonymous_concurrency=1) == 1
    assert concurrency_limit(None, anonymous=False, concurrency=3, anonymous_concurrency=1) == 3


def test_a_limit_of_zero_or_less_is_no_limit() -> None:
    assert unlimited(0)
    assert unlimited(-1)
    assert not unlimited(1)
    assert not over_limit(10_000, 10_000, 0)


@given(st.integers(0, 1000), st.integers(1, 100), st.integers(-5, 1000))
def test_over_limit_when_the_new_generations_pass_a_real_limit(
    in_flight: int, n: int, limit: int
) -> None:
    assert over_limit(in_flight, n, limit) == (limit > 0 and in_flight + n > limit)
