"""A worker's owner at the AI Horde's worker routes, as KoboldAI Lite's
worker page, horde_sdk and zeldafan's client call them: PUT with info,
name, paused and team (each applied or refused by name), DELETE, and
GET /workers?name=. Answers validated by horde_sdk's own models; each test
on SQLite and PostgreSQL (``chat_database``), whose row locks a delete takes."""

from __future__ import annotations

import pytest
from horde_sdk.ai_horde_api.apimodels import (
    AllWorkersDetailsResponse,
    DeleteWorkerResponse,
    ModifyWorkerResponse,
)

from hordelite.testing import FakeTextWorker
from tests.integration._env import open_env
from tests.integration._helpers import assert_refused, worker_id

pytestmark = pytest.mark.anyio


async def test_put_applies_info_and_name_and_refuses_what_it_cannot_apply_by_name(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        other = await env.horde.create_key("eve")
        worker = await env.text_worker("first")
        others = await env.text_worker("taken", key=other)
        await worker.pop()
        await others.pop()
        wid = await worker_id(env.client, "first")
        url = f"/api/v2/workers/{wid}"
        own = {"apikey": env.owner}

        put = await env.client.put(url, headers=own, json={"info": "A 7B on a 3060."})
        assert put.status_code == 200, put.text
        ModifyWorkerResponse.model_validate(put.json())
        assert put.json() == {"info": "A 7B on a 3060."}
        assert (await env.client.get(url)).json()["info"] == "A 7B on a 3060."

        put = await env.client.put(url, headers=own, json={"name": "Second"})
        assert put.json() == {"name": "Second"}
        assert (await env.client.get("/api/v2/workers/name/second")).json()["id"] == wid
        assert (await env.client.get("/api/v2/workers/name/first")).status_code == 404

        clash = await env.client.put(url, headers=own, json={"name": "TAKEN"})
        assert_refused(clash, 400, "NameAlreadyExists")
        assert "name" in clash.json()["errors"]
        refused = {
            ("team", "red"): (404, "TeamNotFound"),
            ("info", "x" * 1001): (400, "BadRequest"),
            ("name", "bad\u0007name"): (400, "BadRequest"),
            ("maintenance_msg", "back soon"): (400, "BadRequest"),
            ("paused", "yes"): (400, "BadRequest"),
        }
        for (key, value), (status, rc) in refused.items():
            answer = await env.client.put(url, headers=own, json={key: value})
            assert_refused(answer, status, rc)
            assert key in answer.json()["errors"], (key, answer.text)
        assert (await env.client.put(url, headers=own, json={"team": ""})).json() == {"team": ""}
        assert_refused(await env.client.put(url, headers=own, json={}), 400, "NoWorkerModSelected")
        # Nothing refused was applied.
        details = (await env.client.get(url)).json()
        assert (details["name"], details["info"]) == ("Second", "A 7B on a 3060.")

        put = await env.client.put(url, headers=own, json={"info": ""})
        assert (await env.client.get(url)).json()["info"] is None


async def test_paused_is_an_admins_and_a_paused_worker_checks_in_and_gets_no_job(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        admin = await env.horde.create_key("root", admin=True)
        worker = await env.text_worker("w")
        await worker.pop()
        url = f"/api/v2/workers/{await worker_id(env.client, 'w')}"
        refused = await env.client.put(url, headers={"apikey": env.owner}, json={"paused": True})
        assert_refused(refused, 403, "NotModerator")

        put = await env.client.put(url, headers={"apikey": admin}, json={"paused": True})
        assert put.json() == {"paused": True}
        request_id = await env.submit_text("wait for me")
        assert (await worker.pop())["id"] is None
        details = (await env.client.get(url)).json()
        assert (details["paused"], details["online"]) == (True, True)
        # Not counted as serving the model while paused.
        models = await env.client.get("/api/v2/status/models", params={"type": "text"})
        assert models.json() == []

        await env.client.put(url, headers={"apikey": admin}, json={"paused": False})
        job = await worker.pop()
        assert job["id"] is not None
        await worker.submit(job["id"], "done")
        assert (await env.text_status(request_id))["done"] is True


async def test_an_admins_pause_and_maintenance_survive_a_delete_and_a_pop_anew(
    chat_database: str | None,
) -> None:
    """Issue 35: an owner whose worker an admin paused deleted it and popped
    again under its name; the new worker was not paused and took the job.
    The pause (and maintenance) stays with the owner's name (decision 0073),
    under any spelling of it, and through a rename onto it; another user
    popping the name once it is free gets a worker of its own, unpaused."""
    async with open_env(database=chat_database) as env:
        other = await env.horde.create_key("eve")
        admin = await env.horde.create_key("root", admin=True)

        async def delete(name: str, key: str) -> None:
            gone = await env.client.delete(
                f"/api/v2/workers/{await worker_id(env.client, name)}", headers={"apikey": key}
            )
            assert gone.status_code == 200, gone.text

        async with FakeTextWorker(env.horde.url, env.owner, name="Held", models=["m1"]) as worker:
            await worker.pop()
            url = f"/api/v2/workers/{await worker_id(env.client, 'Held')}"
            put = await env.client.put(url, headers={"apikey": admin}, json={"paused": True})
            assert put.json() == {"paused": True}
            request_id = await env.submit_text("wait for me")
            await delete("Held", env.owner)
        # Popped anew under another spelling of the name: paused, no job.
        async with FakeTextWorker(env.horde.url, env.owner, name="HELD", models=["m1"]) as again:
            assert (await again.pop())["id"] is None
            assert (await again.pop())["id"] is None
            url = f"/api/v2/workers/{await worker_id(env.client, 'HELD')}"
            assert (await env.client.get(url)).json()["paused"] is True
            await delete("HELD", env.owner)
        # A rename of another of the owner's workers onto the name takes the pause.
        async with FakeTextWorker(env.horde.url, env.owner, name="spare", models=["m1"]) as spare:
            await spare.pop()
            url = f"/api/v2/workers/{await worker_id(env.client, 'spare')}"
            put = await env.client.put(url, headers={"apikey": env.owner}, json={"name": "held"})
            assert put.json() == {"name": "held"}
            assert (await env.client.get(url)).json()["paused"] is True
            assert (await spare.pop())["id"] is None
            # Lifted by an admin only, as any pause.
            await env.client.put(url, headers={"apikey": admin}, json={"paused": False})
            await env.client.put(url, headers={"apikey": env.owner}, json={"maintenance": True})
            await delete("held", env.owner)
        # Maintenance stays too: the first pop registers and gets nothing,
        # the next is refused until the owner clears it.
        async with FakeTextWorker(env.horde.url, env.owner, name="held", models=["m1"]) as back:
            assert (await back.pop())["id"] is None
            refused = await back.client.post("/generate/text/pop", json=back.pop_body())
            assert_refused(refused, 403, "WorkerMaintenance")
            url = f"/api/v2/workers/{await worker_id(env.client, 'held')}"
            details = (await env.client.get(url)).json()
            assert (details["maintenance_mode"], details["paused"]) == (True, False)
            await delete("held", env.owner)
        # Another user's pop of the free name is no heir to bob's holds.
        async with FakeTextWorker(env.horde.url, other, name="held", models=["m1"]) as eve:
            job = await eve.pop()
            assert job["id"] is not None
            await eve.submit(job["id"], "done")
        assert (await env.text_status(request_id))["done"] is True


async def test_delete_gives_back_the_workers_job_and_frees_its_name(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        other = await env.horde.create_key("eve")
        doomed = await env.text_worker("doomed")
        helper = await env.text_worker("helper", key=other)
        request_id = await env.submit_text("Finish me")
        job = await doomed.pop()
        assert job["id"] is not None
        wid = await worker_id(env.client, "doomed")
        url = f"/api/v2/workers/{wid}"

        assert_refused(
            await env.client.delete(url, headers={"apikey": other}), 403, "WrongCredentials"
        )
        gone = await env.client.delete(url, headers={"apikey": env.owner})
        assert gone.status_code == 200, gone.text
        DeleteWorkerResponse.model_validate(gone.json())
        assert gone.json() == {"deleted_id": wid, "deleted_name": "doomed"}

        assert_refused(await env.client.get(url), 404, "WorkerNotFound")
        assert_refused(
            await env.client.delete(url, headers={"apikey": env.owner}), 404, "WorkerNotFound"
        )
        user = (await env.client.get("/api/v2/find_user", headers={"apikey": env.owner})).json()
        assert user["worker_ids"] == []
        # Its job went back to the queue at once, for another worker.
        status = await env.text_status(request_id)
        assert (status["waiting"], status["processing"], status["restarted"]) == (1, 0, 1)
        late = await doomed.client.post(
            "/generate/text/submit", json={"id": job["id"], "generation": "late"}
        )
        assert_refused(late, 400, "AbortedGen")
        second = await helper.pop()
        assert second["payload"]["prompt"] == "Finish me"
        await helper.submit(second["id"], "finished")
        assert (await env.text_status(request_id))["done"] is True

        # The name is free again: the next pop with it is a new worker.
        await doomed.pop()
        assert await worker_id(env.client, "doomed") != wid


async def test_workers_by_name_is_the_exact_name_case_insensitively_as_a_list(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        alpha = await env.text_worker("Alpha")
        alphabet = await env.text_worker("Alphabet")
        await alpha.pop()
        await alphabet.pop()
        found = (await env.client.get("/api/v2/workers", params={"name": "alpha"})).json()
        AllWorkersDetailsResponse.model_validate(found)
        assert [w["name"] for w in found] == ["Alpha"]
        assert (await env.client.get("/api/v2/workers", params={"name": "Alp"})).json() == []
        every = (await env.client.get("/api/v2/workers")).json()
        assert sorted(w["name"] for w in every) == ["Alpha", "Alphabet"]
