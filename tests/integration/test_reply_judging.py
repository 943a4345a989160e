"""A chat reply is judged by the horde, outside the submit's transaction:
storage judges nothing, and a reply that reaches it without a verdict for
its job is judged again (decision 0047)."""

from __future__ import annotations

from typing import Any

import pytest

from hordelite.contract.chat_features import ALL_NAMES
from hordelite.storage.jobs import Unjudged
from hordelite.storage.store import Store
from tests.integration._chat_helpers import chat_body, open_chat_horde, pop_job
from tests.integration.test_chat_write_lock import COLOUR_SCHEMA

pytestmark = pytest.mark.anyio


def miss_the_first_judging_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The judging read finds no job the first time (as when the job changed
    hands between that read and the write); the job ids it was asked for."""
    reads: list[str] = []
    original = Store.chat_job_to_judge

    async def missing_once(self: Store, **kwargs: Any) -> Any:
        reads.append(kwargs["job_id"])
        return None if len(reads) == 1 else await original(self, **kwargs)

    monkeypatch.setattr(Store, "chat_job_to_judge", missing_once)
    return reads


async def test_a_reply_whose_job_was_not_found_by_the_judging_read_is_judged_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The transaction refuses to store an unjudged reply, and the horde
    # judges it again and stores it.
    reads = miss_the_first_judging_read(monkeypatch)
    raised = []
    original_submit = Store.submit_job

    async def watched(self: Store, **kwargs: Any) -> Any:
        try:
            return await original_submit(self, **kwargs)
        except Unjudged as exc:
            raised.append(exc.job_id)
            raise

    monkeypatch.setattr(Store, "submit_job", watched)
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w1", ALL_NAMES)
        request_id = await env.queue(chat_body(response_format=COLOUR_SCHEMA))
        job = await pop_job(worker)
        reply = {"message": {"role": "assistant", "content": '{"colour": "blue"}'}}
        response = await worker.submit_reply(job, {**reply, "finish_reason": "stop"})
        assert response.status_code == 200, response.text
        assert reads == [job["id"], job["id"]]
        assert raised == [job["id"]]
        status = await env.status(request_id)
        assert status["done"] is True
        assert status["generations"][0]["message"]["content"] == '{"colour": "blue"}'


async def test_a_nonconformant_reply_judged_again_is_still_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The second judging holds the reply to the request as the first would:
    # content that is not the strict schema's JSON is refused, not stored.
    reads = miss_the_first_judging_read(monkeypatch)
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w1", ALL_NAMES)
        request_id = await env.queue(chat_body(response_format=COLOUR_SCHEMA))
        job = await pop_job(worker)
        reply = {"message": {"role": "assistant", "content": "Blue."}, "finish_reason": "stop"}
        response = await worker.submit_reply(job, reply)
        assert response.status_code == 400, response.text
        assert response.json()["rc"] == "ChatSubmitNonconformant"
        assert len(reads) == 2
        assert (await env.status(request_id))["done"] is False
