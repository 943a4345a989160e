"""What one key may register (contract/budgets.py, and the models cap of
parse_pop_request): the cap of each role, where it refuses, and the words."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hordelite.contract import refusals
from hordelite.contract.budgets import NO_WORKER_CAP, WorkerCap, worker_cap
from hordelite.errors import RC

# The defaults of [budgets].
WORKERS, TRUSTED_WORKERS, MODELS = 20, 200, 10


def cap(*, admin: bool = False, trusted: bool = False, plain: int = WORKERS) -> WorkerCap:
    return worker_cap(
        admin=admin,
        trusted=trusted,
        workers_per_user=plain,
        trusted_workers_per_user=TRUSTED_WORKERS,
    )


# Workers per user -------------------------------------------------------------


def test_a_registered_user_has_the_workers_per_user_cap() -> None:
    assert cap() == WorkerCap(WORKERS, "budgets.workers_per_user")


def test_a_trusted_user_has_its_own_cap() -> None:
    assert cap(trusted=True) == WorkerCap(TRUSTED_WORKERS, "budgets.trusted_workers_per_user")


@pytest.mark.parametrize("trusted", [False, True])
def test_an_admin_has_no_cap(trusted: bool) -> None:
    assert cap(admin=True, trusted=trusted) == NO_WORKER_CAP
    assert not NO_WORKER_CAP.refuses(10**9)


def test_the_cap_refuses_the_worker_past_it_only() -> None:
    limit = cap()
    assert not limit.refuses(WORKERS - 1)  # this pop registers the 20th
    assert limit.refuses(WORKERS)  # it would register the 21st
    assert limit.refuses(WORKERS + 5)  # the cap was lowered since


@given(registered=st.integers(0, 10**6))
def test_zero_is_no_limit(registered: int) -> None:
    assert not cap(plain=0).refuses(registered)


@given(limit=st.integers(1, 10**4), registered=st.integers(0, 10**4))
def test_a_cap_refuses_exactly_when_registering_would_pass_it(limit: int, registered: int) -> None:
    assert cap(plain=limit).refuses(registered) == (registered + 1 > limit)


def test_one_worker_is_one_worker_in_the_refusal() -> None:
    error = refusals.too_many_workers("w2", 1, 1, "budgets.workers_per_user")
    assert error.message.startswith("This account has 1 worker registered and may have at most 1 ")


def test_the_refusal_names_the_count_the_cap_and_its_key() -> None:
    error = refusals.too_many_workers("w21", 20, 20, "budgets.workers_per_user")
    assert error.rc is RC.TooManyWorkers
    assert error.status == 403
    assert error.message == (
        "This account has 20 workers registered and may have at most 20 "
        "(budgets.workers_per_user); worker 'w21' was not registered. Pop under the "
        "name of one of its workers, or ask the horde's operator for a higher limit."
    )
