"""Streaming progress over real HTTP (issue 5; worker guide: "Streaming progress",
"7. Fault a job"; chat guide: "Streaming" and its lease state diagram, "Pricing by
the text output estimate").

A plain streamed chat request's job is popped with ``stream_progress: true``;
its worker posts text to POST /api/v2/generate/text/progress, answered from
a lease written at pop. The lease is extended by posts, ended by a submit, a
fault or its expiry, and cancelled by the client, which settles the job on
the posted text. Pops prefer workers that generate max_length within 120 s.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hordelite.contract.chat_features import ALL_NAMES
from hordelite.testing import FakeChatWorker, ManualClock
from tests.integration._chat_helpers import (
    MODEL,
    WEATHER_TOOL,
    ChatEnv,
    chat_body,
    chat_price,
    chat_status_path,
    open_chat_horde,
    pop_job,
    pop_nothing,
)
from tests.integration._helpers import assert_refused

pytestmark = pytest.mark.anyio

PROGRESS = "/api/v2/generate/text/progress"
BILLIONS = 13  # MODEL's size in the model reference these tests write
TTL = 150  # the pop's ttl, the job's lease (worker guide, "Streaming progress")
EXTENSION = 150  # a post with new text extends the lease to this long after it
TRUSTED_CAP = 600  # a trusted worker's lease ends at most this long after pop
UNTRUSTED_CAP = 200  # an untrusted worker's lease ends at most this long after pop
PREFERRED_SECONDS = 120  # the job lease preference (worker guide, "Streaming progress")


# Helpers ---------------------------------------------------------------------------


def expected_price(chars: int, max_length: int) -> tuple[float, float]:
    return chat_price(chars, max_length, BILLIONS)


def text_reply(content: str, reasoning: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {"message": message, "finish_reason": "stop"}


async def progress(
    worker: FakeChatWorker,
    job: dict[str, Any] | str,
    seq: int,
    content: str = "",
    reasoning: str | None = None,
) -> httpx.Response:
    """A progress post by the worker (its owner's key); the raw response."""
    delta: dict[str, Any] = {"content": content}
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    job_id = job if isinstance(job, str) else job["id"]
    return await worker.client.post(
        "/generate/text/progress", json={"id": job_id, "seq": seq, "delta": delta}
    )


def assert_accepted(response: httpx.Response, seq: int, cancelled: bool = False) -> None:
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted_seq": seq, "cancelled": cancelled}


@contextlib.asynccontextmanager
async def progress_horde(
    tmp_path: Path, clock: ManualClock | None = None, **config: Any
) -> AsyncIterator[ChatEnv]:
    """A chat horde pricing MODEL as a BILLIONS model."""
    reference = tmp_path / "models.json"
    reference.write_text(json.dumps({MODEL: {"parameters": BILLIONS * 10**9}}))
    async with open_chat_horde(clock=clock, model_reference=str(reference), **config) as env:
        yield env


async def streamed_job(
    env: ChatEnv, worker: FakeChatWorker, **fields: Any
) -> tuple[str, dict[str, Any]]:
    """Queue a plain streamed request and pop its job: (request id, job)."""
    request_id = await env.queue(chat_body(stream=True, **fields))
    job = await pop_job(worker)
    assert job["payload"].get("stream_progress") is True, job["payload"]
    return request_id, job


async def trusted_worker(env: ChatEnv, name: str) -> FakeChatWorker:
    """An online chat worker whose owner is trusted (its lease cap is 600 s)."""
    owner = await env.horde.create_key(f"owner-of-{name}", trusted=True)
    worker = FakeChatWorker(env.horde.url, owner, name=name, model_id=MODEL)
    await env.stack.enter_async_context(worker)
    await pop_nothing(worker)
    return worker


async def cancel(env: ChatEnv, request_id: str) -> dict[str, Any]:
    response = await env.client.delete(chat_status_path(request_id))
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


# The pop ---------------------------------------------------------------------------


async def test_a_job_popped_for_a_streamed_plain_request_has_stream_progress_true(
    tmp_path: Path,
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        await env.queue(chat_body(stream=True))
        job = await pop_job(worker)
        assert job["payload"]["stream_progress"] is True


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"stream": True, "tools": [WEATHER_TOOL]}, id="streamed with tools"),
        pytest.param(
            {"stream": True, "response_format": {"type": "json_object"}},
            id="streamed json_object",
        ),
        pytest.param({}, id="not streamed"),
    ],
)
async def test_a_job_for_a_request_that_is_not_a_streamed_plain_one_has_no_stream_progress(
    tmp_path: Path, fields: dict[str, Any]
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1", ALL_NAMES)
        await env.queue(chat_body("Name one colour, in json.", **fields))
        job = await pop_job(worker)
        assert "stream_progress" not in job["payload"]


async def test_a_streamed_request_with_response_format_text_streams_progress(
    tmp_path: Path,
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1", ALL_NAMES)
        await env.queue(chat_body(stream=True, response_format={"type": "text"}))
        job = await pop_job(worker)
        assert job["payload"]["stream_progress"] is True


# The post / answer table --------------------------------------------------------------


async def test_accepted_posts_answer_their_seq_and_append_one_stream_entry_each(
    tmp_path: Path,
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        request_id, job = await streamed_job(env, worker)
        assert_accepted(await progress(worker, job, 1, "", "The user wants a colour."), 1)
        assert_accepted(await progress(worker, job, 2, "Blue"), 2)
        assert_accepted(await progress(worker, job, 3, " is nice."), 3)
        entries = await env.horde.horde.signals.read_progress(request_id, 0)
        assert [(e["seq"], e["content"], e["reasoning_content"]) for e in entries] == [
            (1, "", "The user wants a colour."),
            (2, "Blue", ""),
            (3, " is nice.", ""),
        ]
        assert {e["worker"] for e in entries} == {"w1"}
        assert {e["model"] for e in entries} == {MODEL}
        assert len({e["gen"] for e in entries}) == 1


async def test_a_retried_post_is_accepted_again_without_appending(tmp_path: Path) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        request_id, job = await streamed_job(env, worker)
        assert_accepted(await progress(worker, job, 1, "Blue"), 1)
        assert_accepted(await progress(worker, job, 1, "Blue"), 1)
        entries = await env.horde.horde.signals.read_progress(request_id, 0)
        assert [e["content"] for e in entries] == ["Blue"]
        assert_accepted(await progress(worker, job, 2, " sky"), 2)


@pytest.mark.parametrize(
    ("posts", "seq", "content", "expected_seq"),
    [
        pytest.param(1, 3, "late", 2, id="a gap"),
        pytest.param(2, 1, "Blue", 3, id="an old seq"),
        pytest.param(1, 1, "Red", 2, id="changed text under the accepted seq"),
        pytest.param(0, 2, "Blue", 1, id="a first post that is not seq 1"),
    ],
)
async def test_a_post_out_of_sequence_is_refused_409_with_expected_seq(
    tmp_path: Path, posts: int, seq: int, content: str, expected_seq: int
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        request_id, job = await streamed_job(env, worker)
        sent = ["Blue", " sky"][:posts]
        for n, text in enumerate(sent, start=1):
            assert_accepted(await progress(worker, job, n, text), n)
        body = assert_refused(
            await progress(worker, job, seq, content), 409, "ChatProgressOutOfSequence"
        )
        assert body["expected_seq"] == expected_seq
        entries = await env.horde.horde.signals.read_progress(request_id, 0)
        assert [e["content"] for e in entries] == sent


async def test_progress_past_16_bytes_per_max_length_token_is_refused_413(
    tmp_path: Path,
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        max_tokens = 8
        cap = 16 * max_tokens
        _, job = await streamed_job(env, worker, max_tokens=max_tokens)
        assert_accepted(await progress(worker, job, 1, "c" * (cap - 20), "r" * 10), 1)
        # Content and reasoning count together: 10 bytes are left.
        assert_refused(
            await progress(worker, job, 2, "c" * 5, "r" * 6), 413, "ChatProgressCapReached"
        )
        # The cap stops posts, not the job: the reply is still taken.
        response = await worker.submit_reply(job, text_reply("c" * (cap - 20)))
        assert response.status_code == 200, response.text


async def test_a_post_for_a_job_popped_without_streaming_is_refused_404_not_streaming(
    tmp_path: Path,
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        await env.queue(chat_body())
        job = await pop_job(worker)
        assert_refused(await progress(worker, job, 1, "Blue"), 404, "ChatProgressNotStreaming")
        response = await worker.submit_reply(job, text_reply("Blue"))
        assert response.status_code == 200, response.text


async def test_a_post_for_an_unknown_job_is_refused_404_not_streaming(tmp_path: Path) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        response = await progress(worker, str(uuid.uuid4()), 1, "Blue")
        assert_refused(response, 404, "ChatProgressNotStreaming")


async def test_a_post_with_another_users_key_is_refused_403(tmp_path: Path) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        request_id, job = await streamed_job(env, worker)
        response = await env.client.post(
            PROGRESS,
            headers={"apikey": env.requester},
            json={"id": job["id"], "seq": 1, "delta": {"content": "Blue"}},
        )
        assert_refused(response, 403, "WrongCredentials")
        assert await env.horde.horde.signals.read_progress(request_id, 0) == []
        # The owner's worker still posts its first seq.
        assert_accepted(await progress(worker, job, 1, "Blue"), 1)


async def test_a_post_after_the_job_was_submitted_is_refused_404_job_aborted(
    tmp_path: Path,
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        _, job = await streamed_job(env, worker)
        assert_accepted(await progress(worker, job, 1, "Blue"), 1)
        response = await worker.submit_reply(job, text_reply("Blue."))
        assert response.status_code == 200, response.text
        assert_refused(await progress(worker, job, 2, "."), 404, "ChatJobAborted")


async def test_a_post_after_the_job_was_faulted_is_refused_404_job_aborted(
    tmp_path: Path,
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        _, job = await streamed_job(env, worker)
        assert_accepted(await progress(worker, job, 1, "Blue"), 1)
        response = await worker.fault(job)
        assert response.status_code == 200, response.text
        assert_refused(await progress(worker, job, 2, " sky"), 404, "ChatJobAborted")


# The lease ---------------------------------------------------------------------------


async def test_a_progress_extended_lease_keeps_the_job_past_its_ttl_at_the_sweep(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with progress_horde(tmp_path, clock) as env:
        worker = await trusted_worker(env, "w1")
        request_id, job = await streamed_job(env, worker)
        clock.advance(TTL - 10)
        assert_accepted(await progress(worker, job, 1, "Blue"), 1)
        clock.advance(100)  # past the ttl, within 150 s of the post
        result = await env.horde.sweep()
        assert result.expired_jobs == 0
        status = await env.status(request_id)
        assert status["processing"] == 1
        assert status["restarted"] == 0
        assert_accepted(await progress(worker, job, 2, " sky"), 2)
        response = await worker.submit_reply(job, text_reply("Blue sky"))
        assert response.status_code == 200, response.text
        assert response.json()["reward"] > 0


async def test_an_unextended_lease_expires_at_its_ttl_and_the_job_is_requeued(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with progress_horde(tmp_path, clock) as env:
        worker = await env.chat_worker("w1")
        request_id, job = await streamed_job(env, worker)
        clock.advance(TTL + 1)
        result = await env.horde.sweep()
        assert result.expired_jobs == 1
        status = await env.status(request_id)
        assert status["restarted"] == 1
        assert status["processing"] == 0
        assert_refused(await progress(worker, job, 1, "Blue"), 404, "ChatJobAborted")
        assert_refused(await worker.submit_reply(job, text_reply("Blue")), 400, "AbortedGen")


async def test_an_empty_post_does_not_extend_the_lease(tmp_path: Path) -> None:
    clock = ManualClock()
    async with progress_horde(tmp_path, clock) as env:
        worker = await env.chat_worker("w1")
        _, job = await streamed_job(env, worker)
        clock.advance(TTL - 10)
        assert_accepted(await progress(worker, job, 1, ""), 1)
        clock.advance(20)
        result = await env.horde.sweep()
        assert result.expired_jobs == 1


async def test_an_untrusted_workers_posts_keep_its_job_at_most_200_s_from_pop(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with progress_horde(tmp_path, clock) as env:
        worker = await env.chat_worker("w1")  # its owner is not trusted
        _, job = await streamed_job(env, worker)
        clock.advance(TTL - 10)
        assert_accepted(await progress(worker, job, 1, "Blue"), 1)
        clock.advance(UNTRUSTED_CAP - (TTL - 10) - 1)
        assert (await env.horde.sweep()).expired_jobs == 0
        clock.advance(2)  # 201 s after the pop, 61 s after the post
        assert (await env.horde.sweep()).expired_jobs == 1
        assert_refused(await worker.submit_reply(job, text_reply("Blue")), 400, "AbortedGen")


async def test_a_trusted_workers_posts_keep_its_job_at_most_600_s_from_pop(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with progress_horde(tmp_path, clock) as env:
        worker = await trusted_worker(env, "w1")
        _, job = await streamed_job(env, worker)
        for seq in (1, 2, 3, 4):
            clock.advance(TTL - 10)
            assert_accepted(await progress(worker, job, seq, f"part {seq} "), seq)
        # 560 s after the pop, its last post would keep it to 710 s: capped at 600.
        clock.advance(TRUSTED_CAP - 4 * (TTL - 10) - 1)
        assert (await env.horde.sweep()).expired_jobs == 0
        clock.advance(2)
        assert (await env.horde.sweep()).expired_jobs == 1
        assert_refused(await worker.submit_reply(job, text_reply("part 1 ")), 400, "AbortedGen")


# Cancel and settlement ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("posts", "max_tokens"),
    [
        pytest.param([("Blue", ""), (" is", "")], 64, id="under the 20-token floor"),
        pytest.param(
            [
                ("", "The user wants one colour; blue is common. " * 2),
                ("Blue is the sky. " * 5, ""),
            ],
            64,
            id="content and reasoning",
        ),
        pytest.param([("Blue is the colour of the sky. " * 6, "")], 30, id="capped at max_length"),
    ],
)
async def test_a_cancelled_streamed_job_is_settled_on_the_text_posted_before_the_cancel(
    tmp_path: Path, posts: list[tuple[str, str]], max_tokens: int
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        paid_before, earned_before = await env.kudos(), await env.kudos(env.owner)
        uncompleted = (await env.worker_details("w1"))["uncompleted_jobs"]
        request_id, job = await streamed_job(env, worker, max_tokens=max_tokens)
        for seq, (content, reasoning) in enumerate(posts, start=1):
            assert_accepted(await progress(worker, job, seq, content, reasoning), seq)
        await cancel(env, request_id)
        # The next answer says so; its text came after the cancel and is not paid.
        after = len(posts) + 1
        assert_accepted(await progress(worker, job, after, "more text " * 5), after, True)
        chars = sum(len(c) + len(r) for c, r in posts)
        reward, charge = expected_price(chars, max_tokens)
        assert await env.kudos(env.owner) == pytest.approx(earned_before + reward)
        assert await env.kudos() == pytest.approx(paid_before - charge)
        status = await env.status(request_id)
        assert status["done"] is True
        assert status["faulted"] is False
        assert status["kudos"] == pytest.approx(charge)
        # Not a dropped job; and the worker stops: a submit is refused.
        assert (await env.worker_details("w1"))["uncompleted_jobs"] == uncompleted
        text = "".join(c for c, _ in posts)
        assert_refused(await worker.submit_reply(job, text_reply(text)), 400, "AbortedGen")
        assert await env.kudos(env.owner) == pytest.approx(earned_before + reward)


async def test_a_cancelled_streamed_job_without_posts_is_settled_at_the_20_token_floor(
    tmp_path: Path,
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        earned_before = await env.kudos(env.owner)
        request_id, job = await streamed_job(env, worker)
        await cancel(env, request_id)
        assert_accepted(await progress(worker, job, 1, "Blue"), 1, cancelled=True)
        reward, _ = expected_price(0, 64)
        assert await env.kudos(env.owner) == pytest.approx(earned_before + reward)


async def test_a_job_that_does_not_stream_is_not_settled_at_the_cancel(tmp_path: Path) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        paid_before, earned_before = await env.kudos(), await env.kudos(env.owner)
        request_id = await env.queue(chat_body())
        job = await pop_job(worker)
        assert "stream_progress" not in job["payload"]
        await cancel(env, request_id)
        assert await env.kudos() == paid_before
        assert await env.kudos(env.owner) == earned_before
        assert (await env.status(request_id))["kudos"] == 0


async def test_a_cancel_settles_only_the_job_in_flight_not_a_job_already_submitted(
    tmp_path: Path,
) -> None:
    async with progress_horde(tmp_path) as env:
        worker = await env.chat_worker("w1")
        paid_before = await env.kudos()
        request_id, job = await streamed_job(env, worker)
        assert_accepted(await progress(worker, job, 1, "Blue"), 1)
        response = await worker.submit_reply(job, text_reply("Blue."))
        assert response.status_code == 200, response.text
        _, charge = expected_price(len("Blue."), 64)
        await cancel(env, request_id)  # the request is done: nothing more
        assert await env.kudos() == pytest.approx(paid_before - charge)
        status = await env.status(request_id)
        assert [g["message"]["content"] for g in status["generations"]] == ["Blue."]


# The job lease preference ------------------------------------------------------------------


async def slow_worker(env: ChatEnv, clock: ManualClock) -> FakeChatWorker:
    """A chat worker measured at 20 tokens in 100 s: 0.2 tokens a second, so
    it generates int(0.2 x 120) = 24 tokens within the preferred 120 s."""
    worker = await env.chat_worker("slow")
    request_id = await env.queue(chat_body(max_tokens=64))
    job = await pop_job(worker)
    clock.advance(100)
    # A short reply is billed the 20-token floor: the worker's speed sample.
    response = await worker.submit_reply(job, text_reply("Blue."))
    assert response.status_code == 200, response.text
    assert (await env.status(request_id))["done"] is True
    return worker


SLOW_SPEED = 20 / 100


async def test_a_chat_job_too_long_for_a_slow_worker_goes_to_a_faster_online_one(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with progress_horde(tmp_path, clock) as env:
        slow = await slow_worker(env, clock)
        fast = await env.chat_worker("fast")
        max_tokens = 64
        assert max_tokens > SLOW_SPEED * PREFERRED_SECONDS
        await env.queue(chat_body(max_tokens=max_tokens, stream=True))
        await pop_nothing(slow)
        job = await pop_job(fast)
        assert job["payload"]["max_length"] == max_tokens


async def test_a_chat_job_a_slow_worker_generates_within_120_s_still_goes_to_it(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with progress_horde(tmp_path, clock) as env:
        slow = await slow_worker(env, clock)
        await env.chat_worker("fast")
        max_tokens = 20
        assert max_tokens <= SLOW_SPEED * PREFERRED_SECONDS
        await env.queue(chat_body(max_tokens=max_tokens))
        job = await pop_job(slow)
        assert job["payload"]["max_length"] == max_tokens


async def test_a_slow_worker_gets_a_long_chat_job_when_no_faster_worker_is_online(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with progress_horde(tmp_path, clock, worker_online=300) as env:
        await env.chat_worker("fast")
        slow = await slow_worker(env, clock)
        # The fast worker's last pop was 100 s ago: 201 s more and it is offline.
        clock.advance(201)
        await pop_nothing(slow)  # the slow one stays online
        max_tokens = 64
        await env.queue(chat_body(max_tokens=max_tokens))
        job = await pop_job(slow)
        assert job["payload"]["max_length"] == max_tokens


# Memory ------------------------------------------------------------------------------

STREAM_RETENTION = 120  # an ended request's stream is kept this long for late readers
ENDED_MARKER = 600  # an ended job's 404 ChatJobAborted marker


async def test_the_streams_of_completed_cancelled_and_faulted_requests_are_freed(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    # max_faults 0: a fault ends the request (faulted) instead of requeueing it.
    async with progress_horde(tmp_path, clock, max_faults=0) as env:
        signals = env.horde.horde.signals
        worker = await env.chat_worker("w1")
        ended: dict[str, str] = {}
        for outcome in ["done", "cancelled", "faulted"] * 3:
            request_id, job = await streamed_job(env, worker)
            assert_accepted(await progress(worker, job, 1, "Blue"), 1)
            if outcome == "done":
                response = await worker.submit_reply(job, text_reply("Blue."))
                assert response.status_code == 200, response.text
            elif outcome == "cancelled":
                await cancel(env, request_id)
            else:
                response = await worker.fault(job, "backend_error")
                assert response.status_code == 200, response.text
            ended[request_id] = outcome
        for request_id, outcome in ended.items():
            status = await env.status(request_id)
            assert status["faulted"] if outcome == "faulted" else status["done"], status
            # Kept a while after the end for a reader still behind.
            assert [e["content"] for e in await signals.read_progress(request_id, 0)] == ["Blue"]
        assert signals.statistics()["streams"] == len(ended)

        clock.advance(STREAM_RETENTION + 1)
        await env.horde.sweep()
        stats = signals.statistics()
        assert (stats["streams"], stats["stream_entries"], stats["ending_streams"]) == (0, 0, 0)
        # The cancelled jobs' leases end at their end, then their markers go.
        clock.advance(EXTENSION)
        await env.horde.sweep()
        clock.advance(ENDED_MARKER + 1)
        await env.horde.sweep()
        assert set(signals.statistics().values()) == {0}, signals.statistics()
