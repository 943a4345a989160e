"""What a fault or an expired lease does (contract/faults.py): requeue or end
the request, which worker counter it adds to, and when maintenance begins."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hordelite.contract import faults
from hordelite.contract.limits import ABORT_WINDOW_SECONDS
from hordelite.errors import RC

# job_fault -----------------------------------------------------------------


def test_a_request_holding_unsendable_text_ends_at_once_and_charges_no_worker() -> None:
    decision = faults.job_fault("backend_error", None, None, holds_unsendable=True)
    assert decision == faults.JobFault(faults.UNSENDABLE, end_request=True, charge="none")


def test_unsendable_text_wins_over_a_nonconformant_reply() -> None:
    nonconformant = RC.ChatSubmitNonconformant.name
    decision = faults.job_fault("reply_refused", nonconformant, "bad", holds_unsendable=True)
    assert (decision.end_request, decision.charge) == (True, "none")


def test_a_fault_after_a_nonconformant_reply_counts_as_nonconformant() -> None:
    nonconformant = RC.ChatSubmitNonconformant.name
    decision = faults.job_fault("reply_refused", nonconformant, "It was bad.", False)
    assert decision == faults.JobFault(
        faults.Fault(RC.ChatWorkerFault.name, "It was bad."),
        end_request=False,
        charge="nonconformant",
    )


def test_a_plain_fault_counts_as_the_workers_abort_with_the_generic_words() -> None:
    decision = faults.job_fault(None, None, None, holds_unsendable=False)
    assert decision == faults.JobFault(faults.GENERIC, end_request=False, charge="abort")


def test_an_expired_lease_is_the_workers_abort_and_does_not_end_the_request_at_once() -> None:
    assert faults.LEASE_EXPIRY.fault == faults.LEASE_EXPIRED
    assert faults.LEASE_EXPIRY.charge == "abort"
    assert not faults.LEASE_EXPIRY.end_request


# give_back -----------------------------------------------------------------


def test_a_fault_within_the_limit_requeues() -> None:
    assert faults.give_back(faults=1, remaining=2, max_faults=3) == (
        faults.GiveBack(2, requeue=True, enqueue=False)
    )


def test_a_request_with_no_job_left_to_hand_out_goes_back_in_the_queue() -> None:
    assert faults.give_back(0, 0, 3).enqueue


def test_the_fault_past_the_limit_ends_the_request() -> None:
    assert faults.give_back(3, 0, 3) == faults.GiveBack(4, requeue=False, enqueue=False)


def test_the_last_fault_within_the_limit_still_requeues() -> None:
    assert faults.give_back(2, 1, 3) == faults.GiveBack(3, requeue=True, enqueue=False)


@given(st.integers(0, 50), st.integers(0, 20), st.integers(0, 50))
def test_give_back_requeues_exactly_while_the_count_is_within_the_limit(
    count: int, remaining: int, max_faults: int
) -> None:
    back = faults.give_back(count, remaining, max_faults)
    assert back.faults == count + 1
    assert back.requeue == (back.faults <= max_faults)
    assert back.enqueue == (back.requeue and remaining == 0)


# count_abort ---------------------------------------------------------------


def test_aborts_within_the_window_add_up_and_past_the_limit_mean_maintenance() -> None:
    assert faults.count_abort(2, 100.0, False, now=200.0, maintenance_aborts=3) == (
        faults.Aborts(3, 100.0, maintenance=False)
    )
    assert faults.count_abort(3, 100.0, False, now=200.0, maintenance_aborts=3) == (
        faults.Aborts(4, 100.0, maintenance=True)
    )


def test_an_abort_after_the_window_starts_a_new_one() -> None:
    now = 100.0 + ABORT_WINDOW_SECONDS
    assert faults.count_abort(9, 100.0, False, now, 3) == faults.Aborts(1, now, False)


def test_maintenance_once_entered_is_kept() -> None:
    assert faults.count_abort(0, 0.0, True, ABORT_WINDOW_SECONDS * 2, 3).maintenance


_time = st.floats(min_value=0.0, max_value=1e9, allow_nan=False)


@given(st.integers(0, 100), _time, st.booleans(), _time, st.integers(0, 100))
def test_count_abort_is_the_windowed_count(
    in_window: int, start: float, maintenance: bool, now: float, limit: int
) -> None:
    aborts = faults.count_abort(in_window, start, maintenance, now, limit)
    fresh = now - start >= ABORT_WINDOW_SECONDS
    assert aborts.in_window == (1 if fresh else in_window + 1)
    assert aborts.window_start == (now if fresh else start)
    assert aborts.maintenance == (maintenance or aborts.in_window > limit)
