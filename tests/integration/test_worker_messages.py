"""Messages to workers, the AI Horde's way: an admin sends one
(POST /workers/messages), the worker's owner lists it, the worker's pops
carry it until it expires. /workers/messages is not read as a worker id."""

from __future__ import annotations

import pytest

from hordelite.testing import ManualClock
from tests.integration._env import open_env
from tests.integration._helpers import assert_refused, worker_id

pytestmark = pytest.mark.anyio

HOUR = 3600


async def test_an_admins_message_reaches_the_workers_pops_and_its_owner_until_it_expires(
    chat_database: str | None,
) -> None:
    clock = ManualClock()
    async with open_env(clock=clock, database=chat_database) as env:
        other = await env.horde.create_key("eve")
        admin = await env.horde.create_key("root", admin=True)
        worker = await env.text_worker("w")
        others = await env.text_worker("x", key=other)
        assert (await worker.pop())["messages"] == []
        await others.pop()
        wid = await worker_id(env.client, "w")
        body = {"worker_id": wid, "message": "Update your model.", "origin": "ops", "expiry": 2}

        refused = await env.client.post(
            "/api/v2/workers/messages", headers={"apikey": env.owner}, json=body
        )
        assert_refused(refused, 403, "NotModerator")
        sent = await env.client.post(
            "/api/v2/workers/messages", headers={"apikey": admin}, json=body
        )
        assert sent.status_code == 200, sent.text
        # horde_sdk 0.33's ResponseModelMessage (0.18 has none).
        assert set(sent.json()) == {"id", "worker_id", "message", "origin", "expiry"}
        message = sent.json()
        assert (message["worker_id"], message["message"], message["expiry"]) == (
            wid,
            "Update your model.",
            2,
        )

        # Its pops carry it, with a job and without one; another's do not.
        assert [m["id"] for m in (await worker.pop())["messages"]] == [message["id"]]
        assert (await others.pop())["messages"] == []
        await env.submit_text("job")
        job = await worker.pop()
        assert job["id"] is not None
        assert [m["message"] for m in job["messages"]] == ["Update your model."]

        mine = await env.client.get("/api/v2/workers/messages", headers={"apikey": env.owner})
        assert [m["id"] for m in mine.json()] == [message["id"]]
        theirs = await env.client.get("/api/v2/workers/messages", headers={"apikey": other})
        assert theirs.json() == []
        snoop = await env.client.get(
            "/api/v2/workers/messages", headers={"apikey": other}, params={"worker_id": wid}
        )
        assert_refused(snoop, 403, "WrongCredentials")
        one = await env.client.get(f"/api/v2/workers/messages/{message['id']}")
        assert one.json()["message"] == "Update your model."

        clock.advance(2 * HOUR + 1)
        assert (await worker.pop())["messages"] == []
        active = await env.client.get("/api/v2/workers/messages", headers={"apikey": env.owner})
        assert active.json() == []
        expired = await env.client.get(
            "/api/v2/workers/messages",
            headers={"apikey": env.owner},
            params={"validity": "expired"},
        )
        assert [m["id"] for m in expired.json()] == [message["id"]]

        path = f"/api/v2/workers/messages/{message['id']}"
        assert_refused(
            await env.client.delete(path, headers={"apikey": env.owner}), 403, "NotModerator"
        )
        gone = await env.client.delete(path, headers={"apikey": admin})
        assert gone.json() == {"message": "OK"}
        assert_refused(await env.client.get(path), 404, "MessageNotFound")


async def test_a_message_is_refused_by_field_and_an_unknown_worker_is_not_found() -> None:
    async with open_env() as env:
        admin = await env.horde.create_key("root", admin=True)
        unknown = "00000000-0000-4000-8000-000000000001"
        good = {"worker_id": unknown, "message": "hi", "expiry": 1}
        sent = await env.client.post(
            "/api/v2/workers/messages", headers={"apikey": admin}, json=good
        )
        assert_refused(sent, 404, "WorkerNotFound")
        for key, value in [
            ("worker_id", None),
            ("message", ""),
            ("message", "x" * 2001),
            ("expiry", 0),
            ("expiry", 24 * 365 + 1),
            ("origin", 5),
        ]:
            answer = await env.client.post(
                "/api/v2/workers/messages",
                headers={"apikey": admin},
                json={**good, key: value},
            )
            assert_refused(answer, 400, "BadRequest")
            assert key in answer.json()["errors"], (key, answer.text)
        listing = await env.client.get(
            "/api/v2/workers/messages", headers={"apikey": admin}, params={"validity": "old"}
        )
        assert "validity" in listing.json()["errors"]
        assert_refused(await env.client.get("/api/v2/workers/messages"), 401, "InvalidAPIKey")
