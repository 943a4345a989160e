"""The refusals storage raises (contract/refusals.py): their return codes and
their exact words, which clients and the docs read."""

from __future__ import annotations

import pytest

from hordelite.contract import refusals
from hordelite.errors import RC, HordeError


@pytest.mark.parametrize(
    ("error", "rc", "message"),
    [
        (refusals.unknown_user(7), RC.UserNotFound, "No user with id 7."),
        (
            refusals.operation_key_reused(),
            RC.OperationKeyReused,
            "This Idempotency-Key was used for a different request; use a new key.",
        ),
        (refusals.unknown_listed_worker("w1"), RC.WorkerNotFound, "workers: no worker with id w1."),
        (
            refusals.too_many_in_flight(3, 2),
            RC.TooManyPrompts,
            "This account has 3 generations in flight and may have at most 2.",
        ),
        (refusals.unknown_request("chat", "r1"), RC.RequestNotFound, "No chat request with id r1."),
        (
            refusals.worker_in_maintenance("Alice", "w1"),
            RC.WorkerMaintenance,
            "Worker 'Alice' is in maintenance mode; its owner can clear it with "
            "PUT /api/v2/workers/w1 and maintenance: false.",
        ),
        (
            refusals.too_many_workers("w3", 2, 2, "budgets.trusted_workers_per_user"),
            RC.TooManyWorkers,
            "This account has 2 workers registered and may have at most 2 "
            "(budgets.trusted_workers_per_user); worker 'w3' was not registered. Pop under "
            "the name of one of its workers, or ask the horde's operator for a higher limit.",
        ),
        (refusals.unknown_worker("w1"), RC.WorkerNotFound, "No worker with id w1."),
        (
            refusals.not_the_workers_owner(),
            RC.WrongCredentials,
            "Only the worker's owner can change it.",
        ),
        (refusals.unknown_job("j1"), RC.InvalidJobID, "No job with id j1."),
        (
            refusals.job_of_another_user(),
            RC.WrongCredentials,
            "This job was given to another user's worker.",
        ),
        (refusals.job_lease_expired(), RC.AbortedGen, "This job was aborted: its lease expired."),
        (refusals.job_request_ended(), RC.AbortedGen, "This job was aborted: its request ended."),
        (
            refusals.wrong_answer_kind("chat"),
            RC.ChatSubmitInvalid,
            "This is a chat job: answer it with message, finish_reason and model_id, not generation.",
        ),
        (
            refusals.wrong_answer_kind("text"),
            RC.ChatSubmitInvalid,
            "This is a text job: answer it with generation, not message.",
        ),
    ],
)
def test_a_refusal_has_its_code_and_words(error: HordeError, rc: RC, message: str) -> None:
    assert (error.rc, error.message) == (rc, message)


def test_a_worker_name_of_another_user_names_the_look_alike_it_matched() -> None:
    same = refusals.worker_name_taken("Alice", "Alice")
    assert same.rc is RC.WrongCredentials
    assert same.message == "The worker name 'Alice' belongs to another user."
    alike = refusals.worker_name_taken("ALICE", "Alice")
    assert alike.message == "The worker name 'ALICE' belongs to another user (as 'Alice')."


def test_kudos_up_front_suggests_a_downgrade_only_for_text() -> None:
    text = refusals.kudos_upfront("max_length", 1024, 512, 50.78, 3.14159, "text")
    assert text.rc is RC.KudosUpfront
    assert text.message == (
        "max_length 1024 is over 512 and needs 50.78 kudos up front; this account has 3.14. "
        "Lower it or set allow_downgrade."
    )
    chat = refusals.kudos_upfront("max_completion_tokens", 1024, 512, 50.78, 0.0, "chat")
    assert chat.message.endswith("this account has 0.0. Lower it.")


NOW = 1000.0


def _submit(**overrides: object) -> RC | None:
    """The code of submit_refusal for a text answer to the owner's text job in
    progress within its lease, with ``overrides``."""
    args: dict[str, object] = {
        "job_state": "processing",
        "job_kind": "text",
        "owned": True,
        "lease_end": NOW + 1,
        "now": NOW,
        "answer_kind": "text",
        "faulted": False,
    }
    refusal = refusals.submit_refusal(**{**args, **overrides})  # type: ignore[arg-type]
    return None if refusal is None else refusal.rc


@pytest.mark.parametrize(
    ("overrides", "rc"),
    [
        ({}, None),
        ({"owned": False}, RC.WrongCredentials),
        # Ownership is checked first: another user learns nothing of the job's state.
        ({"owned": False, "job_state": "done"}, RC.WrongCredentials),
        ({"job_state": "done"}, RC.DuplicateGen),
        ({"job_state": "expired"}, RC.AbortedGen),
        ({"lease_end": NOW - 0.001}, RC.AbortedGen),
        ({"lease_end": NOW}, None),
        ({"job_state": "cancelled"}, RC.AbortedGen),
        ({"job_state": "faulted"}, RC.AbortedGen),
        ({"answer_kind": "chat"}, RC.ChatSubmitInvalid),
        ({"job_kind": "chat"}, RC.ChatSubmitInvalid),
        ({"job_kind": "chat", "answer_kind": "chat"}, None),
        # The kind is judged before the lease and the job's state: a
        # generation for a chat job is refused as such whatever its lease.
        ({"job_kind": "chat", "lease_end": NOW - 1}, RC.ChatSubmitInvalid),
        ({"job_kind": "chat", "job_state": "expired"}, RC.ChatSubmitInvalid),
        ({"answer_kind": "chat", "job_state": "cancelled"}, RC.ChatSubmitInvalid),
        # A fault is taken from either kind of answer.
        ({"job_kind": "chat", "faulted": True}, None),
        ({"answer_kind": "chat", "faulted": True}, None),
        # A late fault is refused like a late reply.
        ({"lease_end": NOW - 1, "faulted": True}, RC.AbortedGen),
    ],
)
def test_which_answers_a_stored_job_takes(overrides: dict[str, object], rc: RC | None) -> None:
    assert _submit(**overrides) is rc
