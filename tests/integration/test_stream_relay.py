"""The front relays a plain streamed request's progress as SSE deltas (issue 5;
chat guide: "Streaming", "What a client can rely on"; worker guide: "Streaming
progress"), read through the official openai SDK's streaming iterator, on
asyncio and trio.

A fake worker pops the job, posts deltas to /api/v2/generate/text/progress
and then submits the whole reply; the client sees the text as it is posted,
paced or (with [front] pace_progress false) one delta per post, and the
final reply reconciles: an extension completes the stream, a divergence
ends it with an error event.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Self

import anyio
import openai
import pytest

from hordelite.testing import FakeChatWorker, ManualClock
from tests.integration._chat_helpers import MODEL
from tests.integration._helpers import eventually
from tests.integration.test_front import chat_request, open_front, open_served_front, streamed

pytestmark = pytest.mark.anyio

# The SDK stops reading at [DONE] without closing its inner async generators;
# trio warns about that with a ResourceWarning (the SDK's, not the front's).
sdk_stream = pytest.mark.filterwarnings(
    "ignore:Async generator '(openai|httpx|httpcore)\\.:ResourceWarning"
)

BILLIONS = 13  # MODEL's size in the model reference these tests write
UNPACED = {"pace_progress": False}
# The worker's posting rhythm in the paced tests (worker guide: about once a second;
# faster here to keep the tests short).
POST_EVERY = 0.25


def body(content: str = "Name one colour.", **fields: Any) -> dict[str, Any]:
    """A streamed call's body (``stream`` True unless ``fields`` say otherwise)."""
    return chat_request(content, **{"stream": True, **fields})


def reply(content: str, reasoning: str | None = None, **counts: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {"message": message, "finish_reason": "stop", **counts}


def reference(tmp_path: Path) -> str:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({MODEL: {"parameters": BILLIONS * 10**9}}))
    return str(path)


async def post(
    worker: FakeChatWorker, job: dict[str, Any], seq: int, content: str = "", reasoning: str = ""
) -> dict[str, Any]:
    """A progress post; returns its 200 answer (fails the test otherwise)."""
    delta = {"content": content, **({"reasoning_content": reasoning} if reasoning else {})}
    response = await worker.client.post(
        "/generate/text/progress", json={"id": job["id"], "seq": seq, "delta": delta}
    )
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def submit(worker: FakeChatWorker, job: dict[str, Any], answer: dict[str, Any]) -> None:
    response = await worker.submit_reply(job, answer)
    assert response.status_code == 200, response.text


async def streamed_job(worker: FakeChatWorker) -> dict[str, Any]:
    """The worker's long-polled pop of the streamed job."""
    job = await worker.pop(wait=10)
    assert job["id"] is not None, job
    assert job["payload"]["stream_progress"] is True
    return job


def content_of(chunk: Any) -> str:
    return chunk.choices[0].delta.content or "" if chunk.choices else ""


def reasoning_of(chunk: Any) -> str:
    """The relayed reasoning: an extra field of the SDK's delta."""
    if not chunk.choices:
        return ""
    extra = chunk.choices[0].delta.model_extra or {}
    return extra.get("reasoning_content") or ""


class Deltas:
    """Content deltas as the client reads them, for a worker that waits for
    each of its posts to reach the client before the next."""

    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[str](100)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.send.close()
        self.receive.close()

    async def seen(self) -> str:
        with anyio.fail_after(10):
            return await self.receive.receive()

    async def call(self, client: openai.AsyncOpenAI, into: list[Any]) -> None:
        """The streamed call ``body()``, its chunks read into ``into`` and
        each content delta passed on to ``seen``."""
        stream = await client.chat.completions.create(**body())
        async for chunk in stream:
            into.append(chunk)
            if content_of(chunk):
                await self.send.send(content_of(chunk))


async def post_then_submit(worker: FakeChatWorker, deltas: Deltas, final: str) -> None:
    """The worker's side of a reconciled stream: it posts "Blue is", waits
    until the client has read it, then submits ``final`` as the whole reply."""
    job = await streamed_job(worker)
    await post(worker, job, 1, "Blue is")
    assert await deltas.seen() == "Blue is"
    await submit(worker, job, reply(final))


# Relayed as posted ---------------------------------------------------------------------


@sdk_stream
async def test_a_paced_stream_shows_several_content_chunks_before_the_worker_submits() -> None:
    parts = ["Blue is ", "the colour ", "of a clear ", "sky at noon."]
    async with open_served_front() as (_, worker, client):
        submitting = anyio.Event()

        async def serve() -> None:
            job = await streamed_job(worker)
            for seq, part in enumerate(parts, start=1):
                await post(worker, job, seq, part)
                await anyio.sleep(POST_EVERY)  # the worker's generation rhythm
            submitting.set()
            await submit(worker, job, reply("".join(parts)))

        seen: list[tuple[str, bool]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            stream = await client.chat.completions.create(**body())
            async for chunk in stream:
                if content_of(chunk):
                    seen.append((content_of(chunk), submitting.is_set()))
        before_submit = [text for text, late in seen if not late]
        assert len(before_submit) > 1, seen
        assert "".join(text for text, _ in seen) == "".join(parts)


@sdk_stream
async def test_a_paced_post_reaches_the_client_in_several_slices() -> None:
    text = "Blue is the colour of a clear sky at noon, and of the sea in summer."
    async with open_served_front() as (_, worker, client):
        submitting = anyio.Event()
        all_seen = anyio.Event()
        received: list[str] = []

        async def serve() -> None:
            job = await streamed_job(worker)
            await post(worker, job, 1, text)
            await all_seen.wait()  # the one post has left the front
            submitting.set()
            await submit(worker, job, reply(text))

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            stream = await client.chat.completions.create(**body())
            async for chunk in stream:
                if content_of(chunk) and not submitting.is_set():
                    received.append(content_of(chunk))
                    if "".join(received) == text:
                        all_seen.set()
        assert len(received) > 2, received
        assert "".join(received) == text


@sdk_stream
async def test_without_pacing_each_post_arrives_as_one_delta() -> None:
    parts = ["Blue", " is the", " colour of the sky", "."]
    async with open_served_front(UNPACED) as (_, worker, client):
        with Deltas() as deltas:

            async def serve() -> None:
                job = await streamed_job(worker)
                for seq, part in enumerate(parts, start=1):
                    await post(worker, job, seq, part)
                    assert await deltas.seen() == part
                await submit(worker, job, reply("".join(parts)))

            chunks: list[Any] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(serve)
                await deltas.call(client, chunks)
            assert [content_of(c) for c in chunks if content_of(c)] == parts
            assert chunks[-1].choices[0].finish_reason == "stop"


@sdk_stream
async def test_a_worker_that_never_posts_still_streams_the_full_reply() -> None:
    async with open_served_front() as (_, worker, client):

        async def serve() -> None:
            job = await streamed_job(worker)
            await submit(worker, job, reply("Blue is the colour of the sky."))

        chunks = await streamed(client, serve)
        assert "".join(content_of(c) for c in chunks) == "Blue is the colour of the sky."
        assert chunks[-1].choices[0].finish_reason == "stop"


# Reasoning -----------------------------------------------------------------------------

THOUGHTS = ["The user wants ", "one colour; ", "blue is common."]


async def serve_reasoning_then_content(worker: FakeChatWorker) -> None:
    job = await streamed_job(worker)
    seq = 0
    for seq, thought in enumerate(THOUGHTS, start=1):
        await post(worker, job, seq, "", thought)
        await anyio.sleep(POST_EVERY)
    await post(worker, job, seq + 1, "Blue")
    await anyio.sleep(POST_EVERY)
    await submit(worker, job, reply("Blue.", "".join(THOUGHTS)))


@sdk_stream
async def test_reasoning_deltas_are_relayed_as_reasoning_content() -> None:
    async with open_served_front() as (_, worker, client):
        chunks = await streamed(client, serve_reasoning_then_content, worker)
        reasoning = [reasoning_of(c) for c in chunks if reasoning_of(c)]
        assert "".join(reasoning) == "".join(THOUGHTS)
        assert "".join(content_of(c) for c in chunks) == "Blue."


@sdk_stream
async def test_reasoning_is_not_relayed_when_include_reasoning_is_false() -> None:
    async with open_served_front() as (_, worker, client):
        chunks = await streamed(
            client,
            serve_reasoning_then_content,
            worker,
            extra_body={"horde": {"include_reasoning": False}},
        )
        assert all(not reasoning_of(c) for c in chunks)
        assert all(
            "reasoning_content" not in (c.choices[0].delta.model_extra or {})
            for c in chunks
            if c.choices
        )
        assert "".join(content_of(c) for c in chunks) == "Blue."


# Reconciling with the final reply ---------------------------------------------------------


@sdk_stream
async def test_a_final_reply_extending_the_relayed_text_completes_the_stream_with_the_rest() -> (
    None
):
    async with open_served_front(UNPACED) as (_, worker, client):
        with Deltas() as deltas:
            chunks: list[Any] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(post_then_submit, worker, deltas, "Blue is the colour of the sky.")
                await deltas.call(client, chunks)
            assert [content_of(c) for c in chunks if content_of(c)] == [
                "Blue is",
                " the colour of the sky.",
            ]
            assert chunks[-1].choices[0].finish_reason == "stop"


@sdk_stream
async def test_a_final_reply_diverging_from_the_relayed_text_raises_chat_stream_diverged() -> None:
    async with open_served_front(UNPACED) as (front, worker, client):
        with Deltas() as deltas:
            chunks: list[Any] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(post_then_submit, worker, deltas, "Red is the colour of fire.")
                with pytest.raises(openai.APIError) as caught:
                    await deltas.call(client, chunks)
            assert caught.value.code == "ChatStreamDiverged"
            assert [content_of(c) for c in chunks if content_of(c)] == ["Blue is"]
            assert all(c.choices[0].finish_reason is None for c in chunks)
            # The whole reply is on the request's status.
            request_id = chunks[0].id.removeprefix("chatcmpl-")
            status = await front.env.status(request_id)
            assert status["generations"][0]["message"]["content"] == "Red is the colour of fire."


async def test_a_diverging_stream_ends_with_one_error_event_then_done() -> None:
    async with open_front(UNPACED) as front:
        worker = await front.worker("w1")
        relayed = anyio.Event()

        async def serve() -> None:
            job = await streamed_job(worker)
            await post(worker, job, 1, "Blue is")
            with anyio.fail_after(10):
                await relayed.wait()
            await submit(worker, job, reply("Red."))

        lines: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            async with front.open_stream(body()) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line:
                        lines.append(line)
                    if '"content":"Blue is"' in line:
                        relayed.set()
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2].removeprefix("data: "))
        assert "choices" not in error
        assert error["error"]["code"] == "ChatStreamDiverged"
        assert error["error"]["message"]
        events = [json.loads(line.removeprefix("data: ")) for line in lines[:-2]]
        assert all(e["choices"][0]["finish_reason"] is None for e in events)


# Usage ---------------------------------------------------------------------------------------


@sdk_stream
async def test_include_usage_gives_a_usage_chunk_after_the_relayed_reply() -> None:
    async with open_served_front() as (_, worker, client):

        async def serve() -> None:
            job = await streamed_job(worker)
            await post(worker, job, 1, "Blue is")
            await anyio.sleep(POST_EVERY)
            await submit(
                worker,
                job,
                reply("Blue is the colour of the sky.", prompt_tokens=12, completion_tokens=8),
            )

        chunks = await streamed(client, serve, stream_options={"include_usage": True})
        *with_choice, last = chunks
        assert "".join(content_of(c) for c in with_choice) == "Blue is the colour of the sky."
        assert with_choice[-1].choices[0].finish_reason == "stop"
        assert all(c.usage is None for c in with_choice)
        assert last.choices == []
        assert last.usage is not None
        assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (12, 8)
        assert last.usage.total_tokens == 20


# Leaving the stream ------------------------------------------------------------------------------


@sdk_stream
async def test_closing_the_stream_cancels_the_request_and_settles_the_streamed_job(
    tmp_path: Path,
) -> None:
    async with open_served_front(UNPACED, model_reference=reference(tmp_path)) as (
        front,
        worker,
        client,
    ):
        env = front.env
        paid_before, earned_before = await env.kudos(), await env.kudos(env.owner)
        jobs: list[dict[str, Any]] = []

        async def serve() -> None:
            job = await streamed_job(worker)
            jobs.append(job)
            await post(worker, job, 1, "Blue is")

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            stream = await client.chat.completions.create(**body())
            chunks: list[Any] = []
            async for chunk in stream:
                chunks.append(chunk)
                if content_of(chunk) == "Blue is":
                    break
            await stream.close()
        request_id = chunks[0].id.removeprefix("chatcmpl-")
        (job,) = jobs

        async def ended() -> bool:
            return bool((await env.status(request_id))["done"])

        await eventually(ended)
        status = await env.status(request_id)
        assert status["generations"] == []
        assert status["faulted"] is False
        assert await post(worker, job, 2, " the colour") == {"accepted_seq": 2, "cancelled": True}
        # Settled on the 7 characters posted: the 20-token floor (chat guide, "Pricing").
        tokens = min(64, max(20, math.ceil(len("Blue is") / 4)))
        reward = round(tokens * BILLIONS / 21, 2)
        assert await env.kudos(env.owner) == pytest.approx(earned_before + reward)
        assert await env.kudos() == pytest.approx(paid_before - (reward + 1))
        late = await worker.submit_reply(job, reply("Blue is the colour of the sky."))
        assert late.status_code == 400
        assert late.json()["rc"] == "AbortedGen"


# Memory --------------------------------------------------------------------------------

STREAM_RETENTION = 120  # an ended request's stream is kept this long for late readers


@sdk_stream
async def test_finished_calls_leave_no_waiters_and_their_streams_go_after_the_retention() -> None:
    clock = ManualClock()
    async with open_served_front(UNPACED, clock=clock) as (front, worker, client):
        signals = front.env.horde.horde.signals

        async def serve() -> None:
            job = await streamed_job(worker)
            await post(worker, job, 1, "Blue")
            await submit(worker, job, reply("Blue."))

        calls = 3
        for _ in range(calls):
            chunks = await streamed(client, serve)
            assert "".join(content_of(c) for c in chunks) == "Blue."

        async def serve_whole() -> None:
            job = await worker.pop(wait=10)
            assert job["id"] is not None, job
            await submit(worker, job, reply("Blue."))

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_whole)
            answer = await client.chat.completions.create(**body(stream=False))
            assert answer.choices[0].message.content == "Blue."

        async def no_waiters() -> bool:
            stats = signals.statistics()
            return stats["request_waiters"] == stats["stream_waiters"] == 0

        await eventually(no_waiters)
        assert signals.statistics()["streams"] == calls
        clock.advance(STREAM_RETENTION + 1)
        await front.env.horde.sweep()
        assert signals.statistics()["streams"] == 0
