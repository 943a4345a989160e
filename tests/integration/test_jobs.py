"""The worker side over real HTTP: pop and submit bodies, refusals, rewards, faults, long-polling."""

from __future__ import annotations

import math
import uuid
from typing import Any

import anyio
import httpx
import pytest

from tests.integration._env import open_env
from tests.integration._helpers import assert_refused

pytestmark = pytest.mark.anyio

POP = "/api/v2/generate/text/pop"
SUBMIT = "/api/v2/generate/text/submit"

# From the specification: tokens are billed at 4 characters each, floored at
# 20 and capped at max_length; a job is worth tokens x billions / 21; the
# requester pays the reward plus 1.
CHARS_PER_TOKEN = 4
MIN_TOKENS = 20
TOKENS_DIVISOR = 21
TAX_PER_JOB = 1
# hordelite/data/models.json: Llama-3.1-8B-Instruct has 8030261248 parameters;
# a model missing from the reference is priced as 1 billion.
LLAMA_8B = ("Llama-3.1-8B-Instruct", 8_030_261_248 / 1e9)
UNKNOWN = ("a-model-nobody-has-heard-of", 1.0)


def expected_reward(text: str, max_length: int, billions: float) -> float:
    tokens = min(max_length, max(MIN_TOKENS, math.ceil(len(text) / CHARS_PER_TOKEN)))
    return round(tokens * billions / TOKENS_DIVISOR, 2)


async def wait_until_online(client: httpx.AsyncClient, name: str) -> None:
    """Poll the worker list until ``name`` is listed online (deadline 5 s)."""
    with anyio.fail_after(5):
        while True:
            listed = (await client.get("/api/v2/workers")).json()
            if any(w["name"] == name and w["online"] for w in listed):
                return


# koboldcpp ----------------------------------------------------------------


async def test_koboldcpp_embedded_worker_pops_and_submits_with_its_exact_bodies() -> None:
    async with open_env() as env:
        owner = await env.horde.create_key("kobold-owner")
        request_id = await env.submit_text(
            "The tavern door creaks", models=["koboldcpp/tiefighter-13b"]
        )
        # Exactly what koboldcpp's run_horde_worker sends.
        headers = {
            "apikey": owner,
            "User-Agent": "KoboldCppEmbeddedWorkerV2",
            "Client-Agent": "KoboldCppEmbedWorker:2",
        }
        gen_dict = {
            "name": "kobold-embedded",
            "models": ["koboldcpp/tiefighter-13b"],
            "max_length": 256,
            "max_context_length": 4096,
            "priority_usernames": [],
            "softprompts": [],
            "bridge_agent": "KoboldCppEmbedWorker:2:https://github.com/LostRuins/koboldcpp",
        }
        response = await env.client.post(POP, headers=headers, json=gen_dict)
        assert response.status_code == 200, response.text
        pop = response.json()
        current_id = pop["id"]
        current_payload = pop["payload"]
        assert current_id is not None
        assert current_payload["prompt"] == "The tavern door creaks"

        submit_dict = {"id": current_id, "generation": " and swings open.", "state": "ok"}
        response = await env.client.post(SUBMIT, headers=headers, json=submit_dict)
        assert response.status_code == 200, response.text
        assert isinstance(response.json()["reward"], float | int)
        status = await env.text_status(request_id)
        assert status["done"] is True
        assert status["generations"][0]["text"] == " and swings open."


# Pop answers --------------------------------------------------------------


async def test_an_empty_pop_answers_the_empty_shape_and_counts_skipped_requests() -> None:
    async with open_env() as env:
        worker = await env.text_worker(max_length=100, max_context_length=2048)
        await env.submit_text("for another model", models=["m2"], max_length=50)
        await env.submit_text("for yet another", models=["m3"], max_length=50)
        await env.submit_text("too long for it", max_length=200)
        answer = await worker.pop()
        assert answer == {
            "id": None,
            "ids": [],
            "payload": {},
            "skipped": {"models": 2, "max_length": 1},
            "softprompt": None,
            "messages": [],
        }


async def test_a_pop_with_a_job_answers_payload_id_ids_model_ttl_and_the_empty_extras() -> None:
    params: dict[str, Any] = {
        "max_length": 60,
        "max_context_length": 1024,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "rep_pen": 1.1,
        "rep_pen_range": 320,
        "stop_sequence": ["\nUser:"],
        "sampler_order": [6, 0, 1, 3, 4, 2, 5],
    }
    async with open_env() as env:
        worker = await env.text_worker()
        await env.submit_text("Hello there", n=2, **params)
        pop = await worker.pop()
        job_id = pop["id"]
        assert str(uuid.UUID(job_id)) == job_id
        expected_payload = {"prompt": "Hello there", "n": 1, **params}
        assert {k: pop["payload"].get(k) for k in expected_payload} == expected_payload
        assert {k: v for k, v in pop.items() if k != "payload"} == {
            "id": job_id,
            "ids": [job_id],
            "model": "m1",
            "ttl": 150,
            "skipped": {},
            "softprompt": None,
            "messages": [],
            "extra_source_images": None,
        }


# Submit ---------------------------------------------------------------------


async def test_a_submit_without_state_from_the_old_kobold_bridge_is_accepted_as_ok() -> None:
    async with open_env() as env:
        worker = await env.text_worker()
        request_id = await env.submit_text("Old bridge")
        job = await worker.pop()
        response = await worker.client.post(
            "/generate/text/submit", json={"id": job["id"], "generation": "still works"}
        )
        assert response.status_code == 200, response.text
        assert "reward" in response.json()
        status = await env.text_status(request_id)
        assert status["done"] is True
        assert status["generations"][0]["state"] == "ok"


# Refusals -------------------------------------------------------------------


async def test_the_anonymous_key_cannot_pop_and_gets_AnonForbiddenWorker() -> None:
    async with open_env() as env:
        worker = await env.text_worker(key="0000000000")
        response = await worker.client.post("/generate/text/pop", json=worker.pop_body())
        assert_refused(response, 403, "AnonForbiddenWorker")


async def test_a_worker_name_first_used_by_another_user_is_refused_with_WrongCredentials() -> None:
    async with open_env(requester_kudos=0) as env:
        mallory = await env.horde.create_key("mallory")
        first = await env.text_worker("shared-name", ["fake-model"], key=env.requester)
        second = await env.text_worker("shared-name", ["fake-model"], key=mallory)
        await first.pop()
        response = await second.client.post("/generate/text/pop", json=second.pop_body())
        assert_refused(response, 403, "WrongCredentials")


async def test_worker_names_that_differ_only_in_case_or_look_alikes_are_one_worker_shown_as_first_sent() -> (
    None
):
    async with open_env(requester_kudos=0) as env:
        mallory = await env.horde.create_key("mallory")
        worker = await env.text_worker("Alice", key=env.requester)
        await worker.pop()
        first = (await env.client.get("/api/v2/workers/name/Alice")).json()
        # The same user popping under another spelling is the same worker.
        for spelling in ("ALICE", "alice", "\uff21lice", "Al\u200dice", "A\u200blice"):
            body = {**worker.pop_body(), "name": spelling}
            answer = await worker.client.post("/generate/text/pop", json=body)
            assert answer.status_code == 200, (spelling, answer.text)
        listed = (await env.client.get("/api/v2/workers")).json()
        assert [(w["id"], w["name"]) for w in listed] == [(first["id"], "Alice")]
        # Any spelling finds it by name.
        for spelling in ("ALICE", "\uff41\uff4c\uff49\uff43\uff45", "ali\u2060ce"):
            found = await env.client.get(f"/api/v2/workers/name/{spelling}")
            assert found.status_code == 200, (spelling, found.text)
            assert found.json()["id"] == first["id"]
            assert found.json()["name"] == "Alice"
        # Another user's look-alike of the name is the taken name.
        body = {**worker.pop_body(), "name": "\uff41LICE"}
        taken = await env.client.post(POP, headers={"apikey": mallory}, json=body)
        assert_refused(taken, 403, "WrongCredentials")
        assert "'Alice'" in taken.json()["message"]


@pytest.mark.parametrize(
    "name", ["a\u0000b", "tab\there", "bell\u0007", "c1\u0085end", "\u200d\u200b"]
)
async def test_a_worker_name_with_a_control_character_or_nothing_visible_is_400_naming_the_field(
    name: str,
) -> None:
    async with open_env() as env:
        body = {"name": name, "models": ["m1"]}
        answer = await env.client.post(POP, headers={"apikey": env.owner}, json=body)
        assert_refused(answer, 400, "BadRequest")
        assert list(answer.json()["errors"]) == ["name"]
        assert (await env.client.get("/api/v2/workers")).json() == []


async def test_submitting_another_users_job_is_refused_with_WrongCredentials() -> None:
    async with open_env() as env:
        mallory = await env.horde.create_key("mallory")
        worker = await env.text_worker("owners-worker")
        await env.submit_text("Mine")
        job = await worker.pop()
        response = await env.client.post(
            SUBMIT,
            headers={"apikey": mallory},
            json={"id": job["id"], "generation": "stolen", "state": "ok"},
        )
        assert_refused(response, 403, "WrongCredentials")
        # The refusal changed nothing: the job's own worker still submits it.
        assert "reward" in await worker.submit(job["id"], "honest")


async def test_submitting_an_unknown_job_id_is_refused_with_InvalidJobID() -> None:
    async with open_env() as env:
        worker = await env.text_worker(models=["fake-model"])
        response = await worker.client.post(
            "/generate/text/submit",
            json={"id": str(uuid.uuid4()), "generation": "from nowhere", "state": "ok"},
        )
        assert_refused(response, 404, "InvalidJobID")


async def test_a_second_submit_of_the_same_job_is_refused_with_DuplicateGen() -> None:
    async with open_env() as env:
        worker = await env.text_worker()
        await env.submit_text("Once")
        job = await worker.pop()
        await worker.submit(job["id"], "first")
        response = await worker.client.post(
            "/generate/text/submit",
            json={"id": job["id"], "generation": "again", "state": "ok"},
        )
        assert_refused(response, 400, "DuplicateGen")


# Rewards --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "billions"), [LLAMA_8B, UNKNOWN], ids=["in-reference", "unknown"]
)
@pytest.mark.parametrize("text_chars", [10, 250, 1000], ids=["floor-20", "chars-over-4", "capped"])
async def test_a_submit_is_rewarded_billed_tokens_times_model_billions_over_21(
    model: str, billions: float, text_chars: int
) -> None:
    max_length = 100
    text = "y" * text_chars
    async with open_env() as env:
        worker = await env.text_worker(models=[model])
        await env.submit_text("Price me", models=[model], max_length=max_length)
        job = await worker.pop()
        answer = await worker.submit(job["id"], text)
        assert answer["reward"] == expected_reward(text, max_length, billions)


async def test_a_job_costs_the_requester_reward_plus_one_and_pays_the_owner_reward() -> None:
    model, billions = LLAMA_8B
    max_length = 120
    text = "The quick brown fox jumps over the lazy dog. " * 6
    async with open_env(owner_kudos=7) as env:
        worker = await env.text_worker(models=[model])
        requester_before = await env.kudos()
        owner_before = await env.kudos(env.owner)
        await env.submit_text("Pay for me", models=[model], max_length=max_length)
        job = await worker.pop()
        reward = (await worker.submit(job["id"], text))["reward"]
        assert reward == expected_reward(text, max_length, billions)
        assert await env.kudos() == pytest.approx(
            requester_before - (reward + TAX_PER_JOB), abs=0.011
        )
        assert await env.kudos(env.owner) == pytest.approx(owner_before + reward, abs=0.011)


# Faults ---------------------------------------------------------------------


async def test_a_faulted_submit_earns_nothing_and_puts_the_request_back_for_a_new_job() -> None:
    async with open_env() as env:
        worker = await env.text_worker()
        request_id = await env.submit_text("Try again")
        first = await worker.pop()
        assert (await worker.submit(first["id"], "", state="faulted")) == {"reward": 0}
        status = await env.text_status(request_id)
        assert status["restarted"] == 1
        assert status["faulted"] is False
        second = await worker.pop()
        assert second["id"] is not None
        assert second["id"] != first["id"]
        assert second["payload"]["prompt"] == "Try again"


async def test_a_request_with_more_than_two_faulted_jobs_ends_faulted_and_unpopped() -> None:
    async with open_env() as env:
        worker = await env.text_worker()
        request_id = await env.submit_text("Cursed")
        for fault in range(1, 4):
            job = await worker.pop()
            assert job["id"] is not None, f"no job for attempt {fault}"
            await worker.submit(job["id"], "", state="faulted")
            status = await env.text_status(request_id)
            assert status["faulted"] is (fault > 2), fault
        assert (await worker.pop())["id"] is None


# Long-polling -----------------------------------------------------------------


async def test_a_long_polling_pop_returns_the_job_of_a_request_submitted_while_it_waits() -> None:
    wait = 5
    async with open_env() as env:
        worker = await env.text_worker("patient")
        popped: dict[str, Any] = {}

        async def pop_and_time() -> None:
            start = anyio.current_time()
            popped.update(await worker.pop(wait=wait))
            popped["elapsed"] = anyio.current_time() - start

        async with anyio.create_task_group() as tg:
            tg.start_soon(pop_and_time)
            # The pop checks the worker in before it waits.
            await wait_until_online(env.client, "patient")
            request_id = await env.submit_text("Wake up")
        assert popped["id"] is not None
        assert popped["payload"]["prompt"] == "Wake up"
        # Answered by the request's arrival, not by the end of the wait.
        assert popped["elapsed"] < wait - 1
        assert (await env.text_status(request_id))["processing"] == 1


async def test_a_long_polling_pop_with_nothing_to_do_answers_empty_after_its_wait() -> None:
    wait = 0.3
    async with open_env() as env:
        worker = await env.text_worker()
        start = anyio.current_time()
        answer = await worker.pop(wait=wait)
        elapsed = anyio.current_time() - start
        assert answer == {
            "id": None,
            "ids": [],
            "payload": {},
            "skipped": {},
            "softprompt": None,
            "messages": [],
        }
        assert elapsed >= wait - 0.01


async def test_a_long_polling_pop_counts_its_wait_from_when_it_arrived() -> None:
    """A pop whose handler ran late (a busy loop) still answers when its
    client's wait ends: the wait counts from the request's arrival."""
    async with open_env() as env:
        body = {"name": "late", "models": ["m1"], "max_length": 80, "wait": 20}
        arrived = anyio.current_time() - 19.5  # it reached the server 19.5 s ago
        with anyio.fail_after(5):  # without the arrival, this pop waits 20 s
            answer = await env.horde.horde.pop(env.owner, body, arrived=arrived)
        assert answer.job is None


async def test_a_pop_without_wait_answers_immediately() -> None:
    async with open_env() as env:
        worker = await env.text_worker()
        assert "wait" not in worker.pop_body()
        with anyio.fail_after(1):
            answer = await worker.pop()
        assert answer["id"] is None
