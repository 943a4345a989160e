"""The request cycle at query level: users, submit, pop, submit a job, status,
cancel, the sweep's lease expiry and the purge after retention."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import func, select, update

from hordelite.errors import RC, HordeError
from hordelite.horde.service import new_text_request
from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.ledger import SubmitResult
from hordelite.storage.schema import jobs, requests, users
from hordelite.storage.transaction import Tx
from tests.storage.helpers import (
    ANONYMOUS_HASH,
    MODEL_BILLIONS,
    NOW,
    RULES,
    activity_rows,
    billions,
    create_user,
    job_submit,
    pop,
    requester_and_owner,
    status,
    submit,
    text_request,
)

pytestmark = pytest.mark.anyio


def _anonymous_users(conn: Tx) -> int:
    return int(conn.execute(select(func.count()).where(users.c.anonymous.is_(True))).scalar_one())


def _jobs_of(conn: Tx, request_id: str) -> int:
    return int(
        conn.execute(select(func.count()).where(jobs.c.request_id == request_id)).scalar_one()
    )


async def test_ensure_anonymous_creates_the_anonymous_user_once(database: Database) -> None:
    # The fixture already ran it once.
    await database.write(queries.ensure_anonymous, ANONYMOUS_HASH, NOW + 1)

    assert await database.read(_anonymous_users) == 1
    anonymous = await database.read(queries.user_by_key, ANONYMOUS_HASH, RULES)
    assert anonymous.id == 0
    assert anonymous.anonymous is True


async def test_created_users_get_distinct_ids_and_are_found_by_their_key_hash(
    database: Database,
) -> None:
    alice = await create_user(database, "alice", kudos=10)
    bob = await create_user(database, "bob")

    found_alice = await database.read(queries.user_by_key, alice, RULES)
    found_bob = await database.read(queries.user_by_key, bob, RULES)

    assert found_alice.id != found_bob.id
    assert 0 not in (found_alice.id, found_bob.id)
    assert (found_alice.username, found_alice.kudos, found_alice.anonymous) == (
        "alice",
        10,
        False,
    )
    assert (found_bob.username, found_bob.kudos) == ("bob", 0)


async def test_a_submitted_request_is_popped_by_a_worker_of_its_model_with_its_prompt(
    database: Database,
) -> None:
    requester, owner = await requester_and_owner(database)
    request_id = await submit(database, requester, text_request("Hello there", models=["m1"]))

    result = await pop(database, owner, "w1", ["m1"], now=NOW + 5)

    assert result.job is not None
    assert result.job.request_id == request_id
    assert result.job.model == "m1"
    assert result.job.payload["prompt"] == "Hello there"
    assert result.job.ttl == RULES.job_ttl
    parts = await status(database, request_id, now=NOW + 5)
    assert parts.request.state == "waiting"
    assert parts.request.remaining == 0
    assert [(j.id, j.state, j.worker_name) for j in parts.jobs] == [
        (result.job.id, "processing", "w1")
    ]


async def test_a_worker_of_another_model_gets_no_job(database: Database) -> None:
    requester, owner = await requester_and_owner(database)
    await submit(database, requester, text_request(models=["m1"]))

    result = await pop(database, owner, "w1", ["m2"])

    assert result.job is None


@pytest.mark.parametrize("webhook", [None, "https://example.org/hook"])
async def test_a_submit_that_ends_a_request_says_whether_a_webhook_call_is_owed(
    database: Database, webhook: str | None
) -> None:
    # The service wakes its webhook task only when a call is owed: a
    # request without a webhook costs no look for due calls at its end.
    requester, owner = await requester_and_owner(database, kudos=100)
    body = {"models": ["m1"]} if webhook is None else {"models": ["m1"], "webhook": webhook}
    await submit(database, requester, text_request(**body))
    popped = await pop(database, owner, "w1", ["m1"], now=NOW + 1)
    assert popped.job is not None

    result = await database.write(
        queries.submit_job, owner, job_submit(popped.job.id, "The end."), NOW + 2, RULES, billions
    )

    assert result.request_ended is True
    assert result.hook_owed is (webhook is not None)


async def test_submitting_a_job_charges_the_requester_reward_plus_one_and_rewards_the_owner(
    database: Database,
) -> None:
    requester, owner = await requester_and_owner(database, kudos=100)
    request_id = await submit(
        database, requester, text_request(models=["m1"], params={"max_length": 80})
    )
    popped = await pop(database, owner, "w1", ["m1"], now=NOW + 1)
    assert popped.job is not None
    generation = "x" * 200

    result = await database.write(
        queries.submit_job, owner, job_submit(popped.job.id, generation), NOW + 11, RULES, billions
    )

    # The AI Horde text formula: tokens = min(max_length, max(20, ceil(chars / 4))),
    # reward = tokens x billions / 21, the requester pays reward + 1.
    tokens = min(80, max(20, math.ceil(len(generation) / 4)))
    reward = round(tokens * MODEL_BILLIONS / 21, 2)
    assert result.reward == pytest.approx(reward)
    assert result.request_ended is True
    payer = await database.read(queries.user_by_key, requester, RULES)
    earner = await database.read(queries.user_by_key, owner, RULES)
    assert payer.kudos == pytest.approx(100 - (reward + 1))
    assert payer.kudos_spent == pytest.approx(reward + 1)
    assert earner.kudos == pytest.approx(reward)
    assert earner.kudos_earned == pytest.approx(reward)
    parts = await status(database, request_id, now=NOW + 11)
    assert parts.request.state == "done"
    assert parts.request.finished == 1
    assert parts.request.kudos == pytest.approx(reward + 1)
    [job] = parts.jobs
    assert (job.state, job.text, job.tokens) == ("done", generation, tokens)


async def test_a_job_cannot_be_submitted_twice(database: Database) -> None:
    requester, owner = await requester_and_owner(database, kudos=100)
    await submit(database, requester, text_request(models=["m1"]))
    popped = await pop(database, owner, "w1", ["m1"])
    assert popped.job is not None
    await database.write(
        queries.submit_job, owner, job_submit(popped.job.id, "hi"), NOW, RULES, billions
    )

    with pytest.raises(HordeError) as refused:
        await database.write(
            queries.submit_job, owner, job_submit(popped.job.id, "hi"), NOW, RULES, billions
        )

    assert refused.value.rc is RC.DuplicateGen
    payer = await database.read(queries.user_by_key, requester, RULES)
    assert payer.kudos_spent == pytest.approx(1 + round(20 * MODEL_BILLIONS / 21, 2))


def _spoil_stop_sequence(conn: Tx, request_id: str) -> None:
    """A lone surrogate in a stored request's stop sequences, as stored
    before the boundary refused them."""
    params = conn.execute(select(requests.c.params).where(requests.c.id == request_id)).scalar_one()
    conn.execute(
        update(requests)
        .where(requests.c.id == request_id)
        .values(params={**params, "stop_sequence": ["\ud800"]})
    )


async def test_a_fault_on_a_request_holding_a_lone_surrogate_ends_it_and_is_not_the_worker_s_abort(
    database: Database,
) -> None:
    requester, owner = await requester_and_owner(database, kudos=100)
    spoiled = await submit(database, requester, text_request(models=["m1"]))
    await database.write(_spoil_stop_sequence, spoiled)
    popped = await pop(database, owner, "w1", ["m1"])
    assert popped.job is not None
    assert popped.job.payload["stop_sequence"] == ["\ud800"]  # stored and handed out as is
    fault = job_submit(popped.job.id, "", state="faulted")

    result = await database.write(queries.submit_job, owner, fault, NOW, RULES, billions)

    assert (result.request_ended, result.requeued) == (True, False)
    ended = (await status(database, spoiled)).request
    assert (ended.state, ended.restarts) == ("faulted", 0)
    assert "not valid Unicode" in ended.fault_message
    worker = await database.read(queries.worker_details, None, "w1")
    assert worker is not None
    assert (worker.aborts_in_window, worker.uncompleted_jobs) == (0, 0)
    # An ordinary fault still counts.
    ordinary = await submit(database, requester, text_request(models=["m1"]))
    popped = await pop(database, owner, "w1", ["m1"], now=NOW + 1)
    assert popped.job is not None
    assert popped.job.request_id == ordinary
    fault = job_submit(popped.job.id, "", state="faulted")
    result = await database.write(queries.submit_job, owner, fault, NOW + 1, RULES, billions)
    assert result.requeued is True
    worker = await database.read(queries.worker_details, None, "w1")
    assert worker is not None
    assert (worker.aborts_in_window, worker.uncompleted_jobs) == (1, 1)


async def test_request_status_of_an_unknown_id_is_RequestNotFound(database: Database) -> None:
    with pytest.raises(HordeError) as refused:
        await status(database, "00000000-0000-4000-8000-000000000000")

    assert refused.value.rc is RC.RequestNotFound


async def test_cancelling_a_waiting_request_ends_it_and_no_worker_gets_it(
    database: Database,
) -> None:
    requester, owner = await requester_and_owner(database)
    request_id = await submit(database, requester, text_request(models=["m1"]))

    before = await database.write(queries.cancel_request, request_id, "text", NOW + 3, RULES)

    assert before.request.state == "waiting"
    after = await status(database, request_id, now=NOW + 3)
    assert after.request.state == "cancelled"
    assert after.request.ended == NOW + 3
    assert (await pop(database, owner, "w1", ["m1"], now=NOW + 4)).job is None


async def late_job_of_a_cancelled_request(
    database: Database,
) -> tuple[str, str, SubmitResult]:
    """A requester with 50 kudos whose text request, its job out since NOW,
    is cancelled at NOW + 3; the job is submitted at NOW + 4: (the
    requester's key hash, the request's id, the submit's result)."""
    requester, owner = await requester_and_owner(database, kudos=50)
    request_id = await submit(database, requester, text_request(models=["m1"]))
    popped = await pop(database, owner, "w1", ["m1"])
    assert popped.job is not None
    await database.write(queries.cancel_request, request_id, "text", NOW + 3, RULES)
    result = await database.write(
        queries.submit_job, owner, job_submit(popped.job.id, "late"), NOW + 4, RULES, billions
    )
    return requester, request_id, result


async def test_a_job_in_progress_at_a_cancel_is_still_submitted_and_charged(
    database: Database,
) -> None:
    requester, _, result = await late_job_of_a_cancelled_request(database)
    payer = await database.read(queries.user_by_key, requester, RULES)
    assert payer.kudos == pytest.approx(50 - (result.reward + 1))


async def test_a_cancelled_request_stays_cancelled_when_its_last_job_comes_in(
    database: Database,
) -> None:
    _, request_id, _ = await late_job_of_a_cancelled_request(database)

    after = await status(database, request_id, now=NOW + 4)
    assert after.request.state == "cancelled"
    assert after.request.ended == NOW + 3


async def test_a_request_past_its_expiry_waits_for_a_job_still_out(database: Database) -> None:
    requester, owner = await requester_and_owner(database, kudos=50)
    request_id = await submit(database, requester, text_request(models=["m1"], params={"n": 2}))
    popped = await pop(database, owner, "w1", ["m1"], now=NOW + 1)
    assert popped.job is not None
    # A pop moves the request's expiry to a full period after it; the job's
    # progress lease (a streamed job) runs past that expiry.
    expires = NOW + 1 + RULES.request_expiry
    progress = {popped.job.id: expires + 100}

    swept = await database.write(queries.sweep, expires + 1, RULES, progress)

    assert (swept.expired_jobs, swept.ended_requests) == (0, [])
    assert (await status(database, request_id, now=expires + 1)).request.ended is None
    # Once that lease has run out, the same sweep takes the job back and,
    # the request being past its expiry with no job out, expires it.
    later = await database.write(queries.sweep, expires + 101, RULES)
    assert (later.expired_jobs, later.ended_requests) == (1, [request_id])


async def test_the_sweep_requeues_a_job_only_once_its_lease_has_expired(database: Database) -> None:
    requester, owner = await requester_and_owner(database)
    request_id = await submit(database, requester, text_request(models=["m1"]))
    popped_at = NOW + 10
    first = await pop(database, owner, "w1", ["m1"], now=popped_at)
    assert first.job is not None
    lease_end = popped_at + RULES.job_ttl

    at_lease_end = await database.write(queries.sweep, lease_end, RULES)
    assert at_lease_end.expired_jobs == 0
    assert (await pop(database, owner, "w2", ["m1"], now=lease_end)).job is None

    after = await database.write(queries.sweep, lease_end + 1, RULES)

    assert (after.expired_jobs, after.requeued, after.ended_requests) == (1, 1, [])
    parts = await status(database, request_id, now=lease_end + 1)
    assert parts.request.remaining == 1
    assert parts.request.restarts == 1
    second = await pop(database, owner, "w2", ["m1"], now=lease_end + 2)
    assert second.job is not None
    assert second.job.request_id == request_id
    assert second.job.id != first.job.id
    with pytest.raises(HordeError) as refused:
        await database.write(
            queries.submit_job,
            owner,
            job_submit(first.job.id, "late"),
            lease_end + 3,
            RULES,
            billions,
        )
    assert refused.value.rc is RC.AbortedGen


async def ended_request(database: Database, ended_at: float) -> str:
    """A text request popped at NOW + 1 and done at ``ended_at``: its id."""
    requester, owner = await requester_and_owner(database, kudos=100)
    request_id = await submit(database, requester, text_request(models=["m1"]))
    popped = await pop(database, owner, "w1", ["m1"], now=NOW + 1)
    assert popped.job is not None
    await database.write(
        queries.submit_job, owner, job_submit(popped.job.id, "hi"), ended_at, RULES, billions
    )
    return request_id


async def test_an_ended_request_is_purged_with_its_jobs_only_after_the_retention(
    database: Database,
) -> None:
    ended_at = NOW + 2
    request_id = await ended_request(database, ended_at)

    kept = await database.write(queries.sweep, ended_at + RULES.retention, RULES)
    assert kept.purged_requests == 0
    assert (
        await status(database, request_id, now=ended_at + RULES.retention)
    ).request.state == "done"

    purged = await database.write(queries.sweep, ended_at + RULES.retention + 1, RULES)

    assert purged.purged_requests == 1
    with pytest.raises(HordeError) as refused:
        await status(database, request_id, now=ended_at + RULES.retention + 1)
    assert refused.value.rc is RC.RequestNotFound
    assert await database.read(_jobs_of, request_id) == 0


class _Interrupted(Exception):
    pass


def _sweep_then_fail(conn: Tx, now: float) -> None:
    queries.sweep(conn, now, RULES)
    raise _Interrupted


async def test_a_purge_that_rolls_back_leaves_its_jobs_stored_and_no_rollup(
    database: Database,
) -> None:
    ended_at = NOW + 4
    request_id = await ended_request(database, ended_at)
    past = ended_at + RULES.retention + 1

    with pytest.raises(_Interrupted):
        await database.write(_sweep_then_fail, past)

    assert await database.read(activity_rows) == []
    assert await database.read(_jobs_of, request_id) == 1
    # The same purge committed rolls the job up: 4 s from submit to submit.
    assert (await database.write(queries.sweep, past, RULES)).purged_requests == 1
    assert await database.read(_jobs_of, request_id) == 0
    [(minute, n, _, latency_sum)] = await database.read(activity_rows)
    assert (minute, n, latency_sum) == (int(ended_at // 60) * 60, 1, 4.0)


async def test_first_request_finds_the_request_an_operation_key_queued_and_refuses_another(
    database: Database,
) -> None:
    alice = await create_user(database, "alice", kudos=100)
    new = new_text_request(text_request(models=["m1"]), lambda req: 0.0, "op-1")

    def first(key_hash: str, fingerprint: str | None) -> queries.FirstRequest | None:
        return database.run_sync(
            queries.first_request, False, key_hash, "op-1", "text", fingerprint, RULES
        )

    assert first(alice, new.fingerprint) is None
    request_id = "5f0e6a38-3c1d-4a55-9d2c-4f9f3f1d8c11"
    await database.write(
        queries.submit_request, alice, new, request_id, NOW, RULES, 512, "test:1:test"
    )
    assert first(alice, new.fingerprint) == queries.FirstRequest(request_id, 80, ("m1",))
    with pytest.raises(HordeError) as reused:
        first(alice, "another request")
    assert reused.value.rc is RC.OperationKeyReused
    other = await create_user(database, "bob")
    assert first(other, new.fingerprint) is None  # another user's operation keys are its own
