"""What one key may register (contract/budgets.py, and the models cap of
parse_pop_request): the cap of each role, where it refuses, and the words."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hordelite.contract import refusals
from hordelite.contract.budgets import NO_WORKER_CAP, WorkerCap, over_models_cap, worker_cap
from hordelite.contract.limits import MAX_MODELS
from hordelite.contract.text import parse_pop_request
from hordelite.errors import RC, HordeError

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


# Models per worker --------------------------------------------------------------


def pop(models: list[str], models_per_worker: int = MODELS) -> Any:
    return parse_pop_request({"name": "w", "models": models}, 30.0, models_per_worker)


def names(count: int) -> list[str]:
    return [f"model-{i}" for i in range(count)]


def test_a_pop_may_declare_models_per_worker_models() -> None:
    assert pop(names(MODELS)).models == tuple(names(MODELS))


def test_a_pop_declaring_one_model_more_is_refused_naming_the_field_and_the_limit() -> None:
    with pytest.raises(HordeError) as info:
        pop(names(MODELS + 1))
    error = info.value
    assert error.rc is RC.TooManyModels
    assert error.status == 400
    assert error.message == (
        "models: declares 11 models; a worker may declare at most 10 (budgets.models_per_worker)."
    )
    assert error.extra["errors"] == {
        "models": "declares 11 models; a worker may declare at most 10"
    }


def test_a_model_named_twice_counts_once() -> None:
    # 12 entries, 10 distinct names: 10 models served.
    declared = [*names(MODELS), "model-0", "model-1"]
    assert pop(declared).models == tuple(names(MODELS))


def test_zero_lifts_the_models_cap_up_to_the_wire_limit() -> None:
    assert len(pop(names(MAX_MODELS), models_per_worker=0).models) == MAX_MODELS
    # MAX_MODELS stays the list's bound, counted as sent.
    with pytest.raises(HordeError) as info:
        pop(names(MAX_MODELS + 1), models_per_worker=0)
    assert info.value.rc is RC.BadRequest


@given(declared=st.integers(1, MAX_MODELS), limit=st.integers(0, MAX_MODELS))
def test_the_models_cap_refuses_exactly_past_a_nonzero_limit(declared: int, limit: int) -> None:
    assert over_models_cap(declared, limit) == (limit > 0 and declared > limit)
