"""The admission plan storage applies under the write lock
(contract.chat_admission.AdmissionPlan.under): the plan when the online
workers' capacity is the one it was worked out for, a Capacity to plan
again against otherwise, and on the last try admission against what the
transaction read."""

from __future__ import annotations

import pytest

from hordelite.contract.admission import NewRequest
from hordelite.contract.chat_admission import AdmissionPlan, Capacity, capacity, plan_admission
from hordelite.contract.chat_request import parse_chat_request
from hordelite.contract.eligibility import WorkerView
from hordelite.errors import RC, HordeError
from tests.views import worker_view

MODEL = "m1"


def worker(max_length: int, chat_model: str = MODEL) -> WorkerView:
    return worker_view(
        id=f"w-{max_length}",
        models=(chat_model,),
        max_length=max_length,
        chat_model=chat_model,
        chat_max_context_length=4096,
        chat_max_length=max_length,
    )


REQ = parse_chat_request(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 300,
        "horde": {"conformance": "best_effort"},
    }
)


def billions(model: str) -> float:
    return 7.0


def plan(online: list[WorkerView] | None, final: bool = False) -> AdmissionPlan:
    seen = None if online is None else capacity(REQ, online)
    return plan_admission(REQ, seen, final, billions, "op-1", "fingerprint-as-sent")


def test_the_plan_for_the_capacity_the_transaction_finds_is_what_is_queued() -> None:
    planned = plan([worker(512)])
    assert isinstance(planned.outcome, NewRequest)
    # Another worker of the same limits: the same capacity, the same plan.
    assert planned.under([worker(512), worker(512)]) is planned.outcome
    assert planned.outcome.fingerprint == "fingerprint-as-sent"


def test_another_capacity_is_answered_with_it_and_nothing_admitted() -> None:
    assert plan([worker(512)]).under([worker(100)]) == Capacity(
        serving=True, longest=100, widest=4096
    )
    # No capacity seen yet for these models: nothing was planned.
    assert plan(None).under([worker(512)]) == capacity(REQ, [worker(512)])


def test_the_last_try_admits_against_what_the_transaction_read() -> None:
    admitted = plan([worker(512)], final=True).under([worker(100)])
    assert isinstance(admitted, NewRequest)
    assert admitted.max_length == 100  # max_tokens 300 lowered to the worker's 100
    assert admitted.fingerprint == "fingerprint-as-sent"
    first_and_last = plan(None, final=True).under([worker(512)])
    assert isinstance(first_and_last, NewRequest)
    assert first_and_last.max_length == 300


def test_a_planned_refusal_is_raised_only_for_the_capacity_it_was_planned_for() -> None:
    unserved = plan([worker(512, chat_model="other")])
    assert isinstance(unserved.outcome, HordeError)
    with pytest.raises(HordeError) as refused:
        unserved.under([worker(256, chat_model="other")])
    assert refused.value.rc is RC.no_eligible_worker
    # A worker for the model came online meanwhile: plan again, do not refuse.
    assert unserved.under([worker(512)]) == capacity(REQ, [worker(512)])
