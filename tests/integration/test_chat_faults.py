"""Faulted chat jobs over real HTTP (worker guide, "7. Fault a job"): the faulted
submit, fault reasons and their messages, how a fault is counted against
the worker, and what happens to a faulted request's jobs."""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

import pytest

from hordelite.contract.chat_features import ALL_NAMES
from hordelite.contract.chat_reply import FAULT_REASONS
from hordelite.testing import FakeChatWorker
from tests.chat_shapes import calling, tool_call
from tests.integration._chat_helpers import ChatEnv
from tests.integration._env import open_env_of
from tests.integration._helpers import assert_refused

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("chat_database")]

MODEL = "fake-chat-model"
MAX_FAULTS = 2  # the default horde.max_faults: the third fault ends a request
MAINTENANCE_ABORTS = 20  # more aborted jobs than this in an hour: maintenance


# Local helpers -------------------------------------------------------------


def text_reply(content: str) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}


def chat_body(**fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name one colour."}],
        "max_tokens": 100,
        **fields,
    }


class Chat(ChatEnv):
    """The set-up, with workers of MODEL that declare every feature."""

    model: ClassVar[str] = MODEL

    def worker(self, name: str) -> FakeChatWorker:
        return FakeChatWorker(
            self.horde.url, self.owner, name=name, model_id=MODEL, chat_features=ALL_NAMES
        )


def chat_horde(**horde_config: Any) -> contextlib.AbstractAsyncContextManager[Chat]:
    return open_env_of(Chat, requester_kudos=1000, **horde_config)


async def pop_job(worker: FakeChatWorker) -> dict[str, Any]:
    job = await worker.pop()
    assert job["id"] is not None, job
    return job


async def fault_ok(worker: FakeChatWorker, job: dict[str, Any], reason: str | None = None) -> None:
    r = await worker.fault(job, reason)
    assert r.status_code == 200, r.text
    assert r.json() == {"reward": 0}


# Each refusal kind: the request's fields, a reply it refuses, and the rc.
REFUSALS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "nonconformant": (
        {"response_format": {"type": "json_object"}},
        text_reply("Blue."),
        "ChatSubmitNonconformant",
    ),
    "invalid_call": (
        {},
        {
            "message": calling(tool_call("call_1", "get_weather")),
            "finish_reason": "tool_calls",
        },
        "ChatSubmitInvalid",
    ),
    "invalid_structure": (
        {},
        {**text_reply("Blue."), "finish_reason": "tool_calls"},
        "ChatSubmitInvalid",
    ),
    "model_mismatch": ({}, {**text_reply("Blue."), "model_id": "other-model"}, "ChatModelMismatch"),
}


# The faulted submit --------------------------------------------------------


async def test_a_faulted_chat_submit_needs_neither_generation_nor_message() -> None:
    async with chat_horde() as chat:
        async with chat.worker("w1") as w1, chat.worker("w2") as w2:
            await w2.pop()  # both online before the request
            request_id = await chat.queue(chat_body())
            first = await pop_job(w1)
            r = await w1.client.post(
                "/generate/text/submit",
                json={"id": first["id"], "state": "faulted", "model_id": first["model"]},
            )
            assert r.status_code == 200, r.text
            assert r.json() == {"reward": 0}
            status = await chat.status(request_id)
            assert status["restarted"] == 1
            assert status["faulted"] is False
            assert status["done"] is False
            # Any eligible worker gets a new job for the same request.
            second = await pop_job(w2)
            assert second["id"] != first["id"]
            assert second["payload"]["messages"] == first["payload"]["messages"]
            r = await w2.submit_reply(second, text_reply("Blue."))
            assert r.status_code == 200, r.text
            status = await chat.status(request_id)
            assert status["done"] is True
            assert [g["worker_name"] for g in status["generations"]] == ["w2"]


@pytest.mark.parametrize("refusal", list(REFUSALS))
async def test_a_fault_after_a_refused_reply_counts_as_a_dropped_job_unless_the_reply_was_nonconformant(
    refusal: str,
) -> None:
    fields, reply, rc = REFUSALS[refusal]
    async with chat_horde() as chat, chat.worker("w1") as worker:
        await worker.pop()
        await chat.queue(chat_body(**fields))
        job = await pop_job(worker)
        before = await chat.worker_details("w1")
        assert_refused(await worker.submit_reply(job, reply), 400, rc)
        await fault_ok(worker, job, "reply_refused")
        after = await chat.worker_details("w1")
        if rc == "ChatSubmitNonconformant":
            assert after["nonconformant_replies"] == before["nonconformant_replies"] + 1
            assert after["uncompleted_jobs"] == before["uncompleted_jobs"]
        else:
            assert after["nonconformant_replies"] == before["nonconformant_replies"]
            assert after["uncompleted_jobs"] == before["uncompleted_jobs"] + 1


# Fault reasons -------------------------------------------------------------


async def fault_until_the_request_ends(
    chat: Chat, worker: FakeChatWorker, request_id: str, reason: str | None
) -> dict[str, Any]:
    """Fault every job of the request until it ends; returns its status."""
    for attempt in range(MAX_FAULTS + 1):
        status = await chat.status(request_id)
        assert status["faulted"] is False, attempt
        await fault_ok(worker, await pop_job(worker), reason)
    return await chat.status(request_id)


@pytest.mark.parametrize("reason", sorted(FAULT_REASONS))
async def test_a_request_faulted_with_a_worker_fault_reason_reports_the_horde_message_for_it(
    reason: str,
) -> None:
    async with chat_horde() as chat, chat.worker("w1") as worker:
        await worker.pop()
        request_id = await chat.queue(chat_body())
        status = await fault_until_the_request_ends(chat, worker, request_id, reason)
        assert status["faulted"] is True
        assert status["fault"] == {"rc": "ChatWorkerFault", "message": FAULT_REASONS[reason]}


async def test_an_unknown_worker_fault_reason_is_ignored() -> None:
    async with chat_horde() as chat, chat.worker("w1") as worker:
        await worker.pop()
        unknown = await chat.queue(chat_body())
        unknown_status = await fault_until_the_request_ends(chat, worker, unknown, "cosmic_rays")
        without = await chat.queue(chat_body())
        without_status = await fault_until_the_request_ends(chat, worker, without, None)
        assert unknown_status["faulted"] is True
        # Accepted as a fault without a reason (worker guide, step 7): the generic
        # fault, not a worker's fault.
        generic = {
            "rc": "ChatRequestFaulted",
            "message": "The request faulted: its workers could not serve it.",
        }
        assert unknown_status["fault"] == without_status["fault"] == generic


@pytest.mark.parametrize("refusal", list(REFUSALS))
async def test_a_reply_refused_fault_keeps_the_message_of_the_refusal_it_follows(
    refusal: str,
) -> None:
    fields, reply, rc = REFUSALS[refusal]
    # max_faults 0: the first fault ends the request.
    async with chat_horde(max_faults=0) as chat, chat.worker("w1") as worker:
        await worker.pop()
        request_id = await chat.queue(chat_body(**fields))
        job = await pop_job(worker)
        message = assert_refused(await worker.submit_reply(job, reply), 400, rc)["message"]
        await fault_ok(worker, job, "reply_refused")
        status = await chat.status(request_id)
        assert status["faulted"] is True
        assert status["fault"] == {"rc": "ChatWorkerFault", "message": message}
        assert message != FAULT_REASONS["reply_refused"]


# The faulted request ---------------------------------------------------------


async def test_a_job_held_when_its_request_faults_is_aborted_and_charges_nobody() -> None:
    # A chat request has one job at a time (n is 1), so a request of two jobs
    # is a text request; chat workers serve it and fault with the chat body.
    async with chat_horde() as chat, chat.worker("w1") as w1, chat.worker("w2") as w2:
        await w1.pop()
        r = await chat.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": chat.requester},
            json={"prompt": "Once upon", "params": {"max_length": 40, "n": 2}, "models": [MODEL]},
        )
        assert r.status_code == 202, r.text
        request_id = r.json()["id"]
        held = await pop_job(w1)
        for _ in range(MAX_FAULTS + 1):
            await fault_ok(w2, await pop_job(w2))
        status = (await chat.client.get(f"/api/v2/generate/text/status/{request_id}")).json()
        assert status["faulted"] is True
        balances = (await chat.kudos(chat.requester), await chat.kudos(chat.owner))
        r = await w1.client.post(
            "/generate/text/submit", json={"id": held["id"], "generation": "a time", "state": "ok"}
        )
        assert_refused(r, 400, "AbortedGen")
        assert (await chat.kudos(chat.requester), await chat.kudos(chat.owner)) == balances


# Maintenance ---------------------------------------------------------------


async def test_nonconformant_faults_do_not_put_a_worker_into_maintenance() -> None:
    async with chat_horde(max_faults=1000) as chat, chat.worker("w1") as worker:
        await worker.pop()
        await chat.queue(chat_body(response_format={"type": "json_object"}))
        for _ in range(MAINTENANCE_ABORTS + 1):
            job = await pop_job(worker)
            assert_refused(
                await worker.submit_reply(job, text_reply("Blue.")), 400, "ChatSubmitNonconformant"
            )
            await fault_ok(worker, job, "reply_refused")
        details = await chat.worker_details("w1")
        assert details["nonconformant_replies"] == MAINTENANCE_ABORTS + 1
        assert details["uncompleted_jobs"] == 0
        assert details["maintenance_mode"] is False


async def test_more_than_20_ordinary_faults_within_an_hour_put_a_worker_into_maintenance() -> None:
    async with chat_horde(max_faults=1000) as chat, chat.worker("w1") as worker:
        await worker.pop()
        await chat.queue(chat_body())
        for _ in range(MAINTENANCE_ABORTS):
            await fault_ok(worker, await pop_job(worker))
        assert (await chat.worker_details("w1"))["maintenance_mode"] is False
        await fault_ok(worker, await pop_job(worker))
        details = await chat.worker_details("w1")
        assert details["uncompleted_jobs"] == MAINTENANCE_ABORTS + 1
        assert details["maintenance_mode"] is True
