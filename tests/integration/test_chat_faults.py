"""Faulted chat jobs over real HTTP (worker guide, "7. Fault a job"): the faulted
submit, fault reasons and their messages, how a fault is counted against
the worker, and what happens to a faulted request's jobs."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from hordelite.contract.chat_features import ALL_NAMES
from hordelite.contract.chat_reply import FAULT_REASONS
from hordelite.testing import FakeChatWorker
from tests.integration._env import open_suite_horde

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


@dataclasses.dataclass
class Chat:
    client: httpx.AsyncClient
    requester: str
    owner: str
    url: str

    def worker(self, name: str) -> FakeChatWorker:
        return FakeChatWorker(
            self.url, self.owner, name=name, model_id=MODEL, chat_features=ALL_NAMES
        )

    async def submit(self, body: dict[str, Any] | None = None) -> str:
        r = await self.client.post(
            "/api/v2/generate/chat/async",
            headers={"apikey": self.requester},
            json=body or chat_body(),
        )
        assert r.status_code == 202, r.text
        return str(r.json()["id"])

    async def status(self, request_id: str) -> dict[str, Any]:
        r = await self.client.get(f"/api/v2/generate/chat/status/{request_id}")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    async def worker_details(self, name: str) -> dict[str, Any]:
        r = await self.client.get(f"/api/v2/workers/name/{name}")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    async def kudos(self, api_key: str) -> float:
        r = await self.client.get("/api/v2/find_user", headers={"apikey": api_key})
        assert r.status_code == 200, r.text
        return float(r.json()["kudos"])


@contextlib.asynccontextmanager
async def chat_horde(**horde_config: Any) -> AsyncIterator[Chat]:
    async with open_suite_horde(**horde_config) as horde:
        requester = await horde.create_key("alice", kudos=1000)
        owner = await horde.create_key("bob")
        async with httpx.AsyncClient(base_url=horde.url) as client:
            yield Chat(client, requester, owner, horde.url)


async def pop_job(worker: FakeChatWorker) -> dict[str, Any]:
    job = await worker.pop()
    assert job["id"] is not None, job
    return job


async def fault_ok(worker: FakeChatWorker, job: dict[str, Any], reason: str | None = None) -> None:
    r = await worker.fault(job, reason)
    assert r.status_code == 200, r.text
    assert r.json() == {"reward": 0}


def assert_refused(response: httpx.Response, rc: str) -> str:
    """The refusal's message."""
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["rc"] == rc, body
    assert body["message"]
    return str(body["message"])


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
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{}"},
                    }
                ],
            },
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
            request_id = await chat.submit()
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
        await chat.submit(chat_body(**fields))
        job = await pop_job(worker)
        before = await chat.worker_details("w1")
        assert_refused(await worker.submit_reply(job, reply), rc)
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
        request_id = await chat.submit()
        status = await fault_until_the_request_ends(chat, worker, request_id, reason)
        assert status["faulted"] is True
        assert status["fault"] == {"rc": "ChatWorkerFault", "message": FAULT_REASONS[reason]}


async def test_an_unknown_worker_fault_reason_is_ignored() -> None:
    async with chat_horde() as chat, chat.worker("w1") as worker:
        await worker.pop()
        unknown = await chat.submit()
        unknown_status = await fault_until_the_request_ends(chat, worker, unknown, "cosmic_rays")
        without = await chat.submit()
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
        request_id = await chat.submit(chat_body(**fields))
        job = await pop_job(worker)
        message = assert_refused(await worker.submit_reply(job, reply), rc)
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
        assert_refused(r, "AbortedGen")
        assert (await chat.kudos(chat.requester), await chat.kudos(chat.owner)) == balances


# Maintenance ---------------------------------------------------------------


async def test_nonconformant_faults_do_not_put_a_worker_into_maintenance() -> None:
    async with chat_horde(max_faults=1000) as chat, chat.worker("w1") as worker:
        await worker.pop()
        await chat.submit(chat_body(response_format={"type": "json_object"}))
        for _ in range(MAINTENANCE_ABORTS + 1):
            job = await pop_job(worker)
            assert_refused(
                await worker.submit_reply(job, text_reply("Blue.")), "ChatSubmitNonconformant"
            )
            await fault_ok(worker, job, "reply_refused")
        details = await chat.worker_details("w1")
        assert details["nonconformant_replies"] == MAINTENANCE_ABORTS + 1
        assert details["uncompleted_jobs"] == 0
        assert details["maintenance_mode"] is False


async def test_more_than_20_ordinary_faults_within_an_hour_put_a_worker_into_maintenance() -> None:
    async with chat_horde(max_faults=1000) as chat, chat.worker("w1") as worker:
        await worker.pop()
        await chat.submit()
        for _ in range(MAINTENANCE_ABORTS):
            await fault_ok(worker, await pop_job(worker))
        assert (await chat.worker_details("w1"))["maintenance_mode"] is False
        await fault_ok(worker, await pop_job(worker))
        details = await chat.worker_details("w1")
        assert details["uncompleted_jobs"] == MAINTENANCE_ABORTS + 1
        assert details["maintenance_mode"] is True
