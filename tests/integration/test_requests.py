"""The client side of the native text API over real HTTP: submit, quote, status, cancel, accounts."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from hordelite import __version__
from hordelite.contract.limits import STATUS_POSITION_SECONDS
from hordelite.storage.schema import requests as requests_table
from hordelite.storage.transaction import Tx
from hordelite.testing import FakeTextWorker, ManualClock
from tests.integration._env import Env, open_env
from tests.integration._helpers import assert_refused

pytestmark = pytest.mark.anyio


ASYNC = "/api/v2/generate/text/async"
MODEL = "fake-model"
# The AI Horde text formula: a job of t tokens on a model of b billion
# parameters is worth round(t * b / 21, 2); the requester pays that plus 1.
KUDOS_DIVISOR = 21
TAX_PER_JOB = 1
UPFRONT_MAX_LENGTH = 512
STATUS_KEYS = {
    "finished",
    "processing",
    "restarted",
    "waiting",
    "done",
    "faulted",
    "wait_time",
    "queue_position",
    "kudos",
    "is_possible",
    "generations",
}
GENERATION_KEYS = {"text", "seed", "gen_metadata", "worker_id", "worker_name", "model", "state"}
WORKER_KEYS = {
    "name",
    "id",
    "type",
    "online",
    "requests_fulfilled",
    "uncompleted_jobs",
    "kudos_rewards",
    "performance",
    "threads",
    "uptime",
    "maintenance_mode",
    "trusted",
    "bridge_agent",
    "nsfw",
    "models",
    "max_length",
    "max_context_length",
}


def quote(n: int, max_length: int, billions: float) -> float:
    return n * (round(max_length * billions / KUDOS_DIVISOR, 2) + TAX_PER_JOB)


def status_path(request_id: str) -> str:
    return f"/api/v2/generate/text/status/{request_id}"


async def queue_text(client: httpx.AsyncClient, key: str, **body: Any) -> httpx.Response:
    body.setdefault("prompt", "Once upon a time")
    return await client.post(ASYNC, headers={"apikey": key}, json=body)


async def kudos_of(client: httpx.AsyncClient, key: str) -> float:
    r = await client.get("/api/v2/find_user", headers={"apikey": key})
    assert r.status_code == 200, r.text
    return r.json()["kudos"]  # type: ignore[no-any-return]


async def status_of(client: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    r = await client.get(status_path(request_id))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def bobs_worker(env: Env, **options: Any) -> FakeTextWorker:
    """A fake worker of the set-up's owner, bob."""
    options.setdefault("models", [MODEL])
    return FakeTextWorker(env.horde.url, env.owner, **options)


# Submitting ------------------------------------------------------------------


async def test_a_request_no_online_worker_can_serve_is_accepted_with_a_warning() -> None:
    async with open_env() as env:
        r = await queue_text(env.client, env.requester, models=[MODEL])
        assert r.status_code == 202, r.text
        body = r.json()
        assert str(uuid.UUID(body["id"])) == body["id"]
        assert isinstance(body["kudos"], int | float)
        assert isinstance(body["message"], str)
        assert body["message"]
        assert body["warnings"], body
        for warning in body["warnings"]:
            assert isinstance(warning["code"], str)
            assert warning["code"]
            assert isinstance(warning["message"], str)
            assert warning["message"]


async def test_a_request_an_online_worker_can_serve_is_accepted_without_a_warning() -> None:
    async with open_env() as env:
        async with bobs_worker(env) as worker:
            assert (await worker.pop())["id"] is None  # the worker is online from its first pop
            r = await queue_text(env.client, env.requester, models=[MODEL])
        assert r.status_code == 202, r.text
        assert "warnings" not in r.json()
        assert "message" not in r.json()


@pytest.fixture
def model_reference(tmp_path: Path) -> str:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"quote-model-7b": {"parameters": 7_000_000_000}}), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("models", "billions", "n", "max_length"),
    [
        pytest.param(["quote-model-7b"], 7.0, 1, 80, id="known-model"),
        pytest.param(["quote-model-7b"], 7.0, 3, 333, id="known-model-n3"),
        pytest.param(["not-in-the-reference"], 1.0, 2, 200, id="unknown-model-as-1B"),
        pytest.param([], 1.0, 1, 100, id="any-model-as-1B"),
        pytest.param(["not-in-the-reference", "quote-model-7b"], 7.0, 2, 64, id="largest-model"),
    ],
)
async def test_a_dry_run_answers_200_with_the_price_of_n_jobs_at_full_max_length(
    model_reference: str, models: list[str], billions: float, n: int, max_length: int
) -> None:
    async with open_env(model_reference=model_reference) as env:
        r = await queue_text(
            env.client,
            env.requester,
            models=models,
            dry_run=True,
            params={"n": n, "max_length": max_length},
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"kudos": pytest.approx(quote(n, max_length, billions), abs=0.005)}


async def test_a_dry_run_stores_nothing_and_charges_nothing() -> None:
    async with open_env() as env:
        r = await queue_text(
            env.client, env.requester, models=[MODEL], dry_run=True, params={"n": 3}
        )
        assert r.status_code == 200, r.text
        assert await kudos_of(env.client, env.requester) == 100
        async with bobs_worker(env) as worker:
            assert (await worker.pop())["id"] is None


# Kudos up front ----------------------------------------------------------------

LONG = 1024  # over the up-front threshold of 512 tokens
LONG_COST = quote(1, LONG, 1.0)  # an unknown model is priced as 1 billion parameters


def long_worker(env: Env) -> FakeTextWorker:
    return bobs_worker(env, max_length=4096, max_context_length=8192)


@pytest.mark.parametrize("kudos", [0, LONG_COST - 1], ids=["no-kudos", "just-short"])
async def test_a_long_request_from_a_user_without_enough_kudos_is_refused_with_KudosUpfront(
    kudos: float,
) -> None:
    async with open_env(requester_kudos=kudos) as env:
        r = await queue_text(env.client, env.requester, models=[MODEL], params={"max_length": LONG})
        assert_refused(r, 403, "KudosUpfront")
        assert await kudos_of(env.client, env.requester) == pytest.approx(kudos)
        async with long_worker(env) as worker:
            assert (await worker.pop())["id"] is None


async def test_a_long_request_with_allow_downgrade_is_queued_at_512_with_a_warning() -> None:
    async with open_env(requester_kudos=0) as env:
        r = await queue_text(
            env.client,
            env.requester,
            models=[MODEL],
            params={"max_length": LONG},
            allow_downgrade=True,
        )
        assert r.status_code == 202, r.text
        assert r.json()["kudos"] == pytest.approx(quote(1, UPFRONT_MAX_LENGTH, 1.0))
        downgrade = [
            w
            for w in r.json()["warnings"]
            if "max_length" in w["message"] and str(UPFRONT_MAX_LENGTH) in w["message"]
        ]
        assert downgrade, r.json()["warnings"]
        async with long_worker(env) as worker:
            job = await worker.pop()
        assert job["id"] is not None
        assert job["payload"]["max_length"] == UPFRONT_MAX_LENGTH


@pytest.mark.parametrize("kudos", [LONG_COST, 1000], ids=["exactly-the-cost", "rich"])
async def test_a_long_request_from_a_user_with_enough_kudos_is_queued_at_its_max_length(
    kudos: float,
) -> None:
    async with open_env(requester_kudos=kudos) as env:
        r = await queue_text(env.client, env.requester, models=[MODEL], params={"max_length": LONG})
        assert r.status_code == 202, r.text
        async with long_worker(env) as worker:
            job = await worker.pop()
        assert job["payload"]["max_length"] == LONG


# Concurrency -------------------------------------------------------------------


@pytest.mark.parametrize("ns", [[3], [1, 1, 1], [2, 1]], ids=["n3", "three-requests", "n2-and-n1"])
async def test_a_user_with_as_many_generations_in_flight_as_allowed_gets_TooManyPrompts(
    ns: list[int],
) -> None:
    async with open_env(concurrency=3) as env:
        for n in ns:
            r = await queue_text(env.client, env.requester, params={"n": n})
            assert r.status_code == 202, r.text
        assert_refused(await queue_text(env.client, env.requester), 429, "TooManyPrompts")


async def test_a_user_below_the_concurrency_limit_is_not_refused() -> None:
    async with open_env(concurrency=3) as env:
        assert (await queue_text(env.client, env.requester, params={"n": 2})).status_code == 202
        assert (await queue_text(env.client, env.requester, params={"n": 1})).status_code == 202


async def test_a_finished_generation_frees_its_concurrency_slot() -> None:
    async with open_env(concurrency=3) as env:
        assert (
            await queue_text(env.client, env.requester, models=[MODEL], params={"n": 3})
        ).status_code == 202
        async with bobs_worker(env) as worker:
            assert await worker.serve_one(wait=0) is not None
        assert (await queue_text(env.client, env.requester, models=[MODEL])).status_code == 202


async def test_a_request_naming_an_unknown_worker_is_refused_with_WorkerNotFound() -> None:
    async with open_env() as env:
        r = await queue_text(env.client, env.requester, models=[MODEL], workers=[str(uuid.uuid4())])
        assert_refused(r, 404, "WorkerNotFound")
        async with bobs_worker(env) as worker:
            assert (await worker.pop())["id"] is None


# Status ------------------------------------------------------------------------


def assert_status_shape(status: dict[str, Any]) -> None:
    assert STATUS_KEYS <= status.keys(), status
    # horde_sdk refuses a float or null in these two.
    assert type(status["wait_time"]) is int, status
    assert type(status["queue_position"]) is int, status


@pytest.mark.parametrize("worker_online", [False, True], ids=["no-worker", "worker-online"])
async def test_status_has_every_field_with_integer_wait_time_and_queue_position_while_waiting_and_done(
    worker_online: bool,
) -> None:
    async with open_env() as env:
        async with bobs_worker(env) as worker:
            if worker_online:
                assert (await worker.pop())["id"] is None
            r = await queue_text(
                env.client, env.requester, models=[MODEL], params={"max_length": 37}
            )
            request_id = r.json()["id"]
            waiting = await status_of(env.client, request_id)
            assert_status_shape(waiting)
            assert (waiting["waiting"], waiting["done"]) == (1, False)
            assert await worker.serve_one(wait=0) is not None
        done = await status_of(env.client, request_id)
        assert_status_shape(done)
        assert (done["waiting"], done["done"], done["finished"]) == (0, True, 1)
        generation = done["generations"][0]
        assert GENERATION_KEYS <= generation.keys()


async def test_queue_position_counts_the_requests_ahead_for_the_same_model() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        ids = {}
        for name, model in [("a", "m1"), ("b", "m1"), ("c", "m2"), ("d", "m1")]:
            r = await queue_text(
                env.client, env.requester, prompt=f"request {name}", models=[model]
            )
            ids[name] = r.json()["id"]
            clock.advance(1)  # equal kudos: the older request is ahead
        positions = {
            name: (await status_of(env.client, rid))["queue_position"] for name, rid in ids.items()
        }
        assert positions == {"a": 0, "b": 1, "c": 0, "d": 2}
        async with bobs_worker(env, models=["m1"]) as worker:
            assert (await worker.pop())["payload"]["prompt"] == "request a"  # the head of m1
        # A waiting request's position is at most STATUS_POSITION_SECONDS old
        # (decision 0038): read again past that, it counts the pop of "a".
        clock.advance(STATUS_POSITION_SECONDS)
        assert (await status_of(env.client, ids["b"]))["queue_position"] == 0
        assert (await status_of(env.client, ids["d"]))["queue_position"] == 1


@pytest.mark.parametrize(
    ("worker_models", "possible"),
    [(["m1"], True), (["m2"], False)],
    ids=["same-model", "other-model"],
)
async def test_is_possible_turns_true_only_once_a_worker_that_can_serve_the_request_has_popped(
    worker_models: list[str], possible: bool
) -> None:
    async with open_env() as env:
        request_id = (
            await queue_text(env.client, env.requester, models=["m1"], params={"n": 2})
        ).json()["id"]
        assert (await status_of(env.client, request_id))["is_possible"] is False
        async with bobs_worker(env, models=worker_models) as worker:
            await worker.pop()
        status = await status_of(env.client, request_id)
        assert status["waiting"] >= 1  # still waiting, so is_possible is about the queue
        assert status["is_possible"] is possible


async def test_delete_on_status_answers_the_status_and_cancels_the_request() -> None:
    async with open_env() as env:
        request_id = (await queue_text(env.client, env.requester, models=[MODEL])).json()["id"]
        r = await env.client.delete(status_path(request_id))
        assert r.status_code == 200, r.text
        assert_status_shape(r.json())
        assert (await status_of(env.client, request_id))["done"] is True
        async with bobs_worker(env) as worker:
            assert (await worker.pop())["id"] is None
        assert await kudos_of(env.client, env.requester) == 100


@pytest.mark.parametrize("method", ["GET", "DELETE"])
@pytest.mark.parametrize(
    "request_id",
    [str(uuid.uuid4()), "not-a-uuid", "ünïcode"],
    ids=["unknown-uuid", "word", "unicode"],
)
async def test_an_unknown_or_malformed_request_id_is_RequestNotFound(
    method: str, request_id: str
) -> None:
    async with open_env() as env:
        r = await env.client.request(method, status_path(request_id))
        assert_refused(r, 404, "RequestNotFound")


# Headers and keys --------------------------------------------------------------


def stored_client_agent(conn: Tx, request_id: str) -> str:
    query = select(requests_table.c.client_agent).where(requests_table.c.id == request_id)
    return str(conn.execute(query).scalar_one())


@pytest.mark.parametrize("header", ["Client-Agent", "client_agent"])
async def test_both_client_agent_header_spellings_are_accepted(header: str) -> None:
    agent = "my-client:1.2:https://example.org"
    async with open_env() as env:
        r = await env.client.post(
            ASYNC,
            headers={"apikey": env.requester, header: agent},
            json={"prompt": "hi", "models": [MODEL]},
        )
        assert r.status_code == 202, r.text
        assert await env.horde.horde.db.read(stored_client_agent, r.json()["id"]) == agent


async def test_the_anonymous_key_can_queue_requests_by_default() -> None:
    async with open_env() as env:
        r = await queue_text(env.client, "0000000000", models=[MODEL])
        assert r.status_code == 202, r.text


async def test_the_anonymous_key_is_refused_with_AnonymousDisabled_when_turned_off() -> None:
    async with open_env(allow_anonymous=False) as env:
        assert_refused(
            await queue_text(env.client, "0000000000", models=[MODEL]), 403, "AnonymousDisabled"
        )
        async with bobs_worker(env) as worker:
            assert (await worker.pop())["id"] is None


ANON = {"apikey": "0000000000"}
# (method, path, headers, body, HTTP status, rc or None for a success)
ANY_ANSWER = [
    pytest.param("GET", "/api/v2/status/heartbeat", {}, None, 200, None, id="heartbeat"),
    pytest.param("POST", ASYNC, ANON, {"prompt": "hi"}, 202, None, id="queued"),
    pytest.param("POST", ASYNC, ANON, {"prompt": "hi", "dry_run": True}, 200, None, id="dry-run"),
    pytest.param(
        "POST",
        ASYNC,
        ANON,
        {"prompt": "hi", "params": {"n": 0}},
        400,
        "BadRequest",
        id="bad-request",
    ),
    pytest.param("POST", ASYNC, {}, {"prompt": "hi"}, 401, "InvalidAPIKey", id="no-key"),
    pytest.param(
        "POST",
        ASYNC,
        {"apikey": "nobody-has-this"},
        {"prompt": "hi"},
        401,
        "InvalidAPIKey",
        id="unknown-key",
    ),
    pytest.param(
        "POST",
        "/api/v2/generate/text/pop",
        ANON,
        {"name": "w", "models": ["m"]},
        403,
        "AnonForbiddenWorker",
        id="anonymous-worker",
    ),
    pytest.param(
        "GET",
        status_path(str(uuid.uuid4())),
        {},
        None,
        404,
        "RequestNotFound",
        id="unknown-request",
    ),
    pytest.param("GET", "/api/v2/no/such/route", {}, None, 404, "NotFound", id="unknown-route"),
    pytest.param("GET", "/nowhere", {}, None, 404, "NotFound", id="outside-the-api"),
    pytest.param("GET", ASYNC, {}, None, 405, "MethodNotAllowed", id="wrong-method"),
    pytest.param(
        "DELETE",
        "/api/v2/status/heartbeat",
        {},
        None,
        405,
        "MethodNotAllowed",
        id="wrong-method-delete",
    ),
]


@pytest.mark.parametrize(("method", "path", "headers", "body", "status", "rc"), ANY_ANSWER)
async def test_every_answer_is_json_with_a_cors_header_and_errors_carry_rc_and_message(
    method: str, path: str, headers: dict[str, str], body: Any, status: int, rc: str | None
) -> None:
    async with open_env() as env:
        r = await env.client.request(method, path, headers=headers, json=body)
        assert r.status_code == status, r.text
        assert r.headers["content-type"].split(";")[0].strip() == "application/json"
        assert r.headers["access-control-allow-origin"] == "*"
        answer = r.json()
        if rc is not None:
            assert answer["rc"] == rc
            assert isinstance(answer["message"], str)
            assert answer["message"]


# Status and accounts -----------------------------------------------------------


async def test_heartbeat_answers_ok_with_the_version() -> None:
    async with open_env() as env:
        r = await env.client.get("/api/v2/status/heartbeat")
        assert r.status_code == 200
        assert r.json() == {"message": "OK", "version": __version__}


async def test_status_models_lists_an_online_workers_model_with_its_threads_and_queue() -> None:
    async with open_env() as env:
        async with bobs_worker(env, models=["stat-a", "stat-b"], threads=3) as worker:
            assert (await worker.pop())["id"] is None
        queued = [(1, 100), (2, 50)]  # (n, max_length) of two waiting requests for stat-a
        for n, max_length in queued:
            r = await queue_text(
                env.client,
                env.requester,
                models=["stat-a"],
                params={"n": n, "max_length": max_length},
            )
            assert r.status_code == 202, r.text
        assert (
            await queue_text(env.client, env.requester, models=["nobody-serves-this"])
        ).status_code == 202
        r = await env.client.get("/api/v2/status/models", params={"type": "text"})
        assert r.status_code == 200, r.text
        by_name = {entry["name"]: entry for entry in r.json()}
        assert set(by_name) == {"stat-a", "stat-b"}
        stat_a = by_name["stat-a"]
        assert stat_a["type"] == "text"
        assert stat_a["count"] == 3
        assert stat_a["queued"] == sum(n * max_length for n, max_length in queued)
        assert stat_a["jobs"] == sum(n for n, _ in queued)
        assert isinstance(stat_a["performance"], int | float)
        assert type(stat_a["eta"]) is int
        assert stat_a["eta"] > 0
        assert (by_name["stat-b"]["queued"], by_name["stat-b"]["jobs"]) == (0, 0)


async def test_the_worker_routes_describe_a_worker_as_it_declared_itself() -> None:
    async with open_env() as env:
        declared: dict[str, Any] = {
            "name": "scribe-1",
            "models": ["koboldcpp/tiny", "other"],
            "max_length": 300,
            "max_context_length": 3000,
            "threads": 2,
            "nsfw": False,
        }
        async with bobs_worker(env, **declared) as worker:
            assert (await worker.pop())["id"] is None
            bridge_agent = worker.pop_body()["bridge_agent"]
        listing = await env.client.get("/api/v2/workers", params={"type": "text"})
        assert listing.status_code == 200, listing.text
        [listed] = listing.json()
        by_id = (await env.client.get(f"/api/v2/workers/{listed['id']}")).json()
        by_name = (await env.client.get("/api/v2/workers/name/scribe-1")).json()
        for answer in (listed, by_id, by_name):
            assert WORKER_KEYS <= answer.keys(), answer
            assert {k: answer[k] for k in declared} == declared
            assert answer["id"] == listed["id"]
            assert (answer["type"], answer["online"], answer["bridge_agent"]) == (
                "text",
                True,
                bridge_agent,
            )
            assert (
                answer["requests_fulfilled"],
                answer["uncompleted_jobs"],
                answer["maintenance_mode"],
            ) == (
                0,
                0,
                False,
            )


async def test_find_user_describes_the_keys_owner() -> None:
    async with open_env(concurrency=7) as env:
        key = await env.horde.create_key("carol", kudos=42.5, trusted=True)
        worker = await env.text_worker(key=key, models=[MODEL])
        assert (await worker.pop())["id"] is None
        r = await env.client.get("/api/v2/find_user", headers={"apikey": key})
        assert r.status_code == 200, r.text
        user = r.json()
        assert isinstance(user["id"], int)
        assert user["username"] == f"carol#{user['id']}"
        assert (user["kudos"], user["concurrency"], user["worker_count"], user["trusted"]) == (
            42.5,
            7,
            1,
            True,
        )


async def test_users_by_id_answers_the_same_user_as_find_user() -> None:
    async with open_env() as env:
        key = await env.horde.create_key("dave", kudos=3)
        found = (await env.client.get("/api/v2/find_user", headers={"apikey": key})).json()
        r = await env.client.get(f"/api/v2/users/{found['id']}")
        assert r.status_code == 200, r.text
        user = r.json()
        assert (user["username"], user["id"], user["kudos"]) == (found["username"], found["id"], 3)


@pytest.mark.parametrize("user_id", ["987654", "abc", "-1", "1e3", "9" * 40, "²"], ids=repr)
async def test_users_by_id_is_UserNotFound_for_unknown_and_non_numeric_ids(user_id: str) -> None:
    async with open_env() as env:
        await env.horde.create_key("dave")
        assert_refused(await env.client.get(f"/api/v2/users/{user_id}"), 404, "UserNotFound")


async def test_a_text_resubmit_with_the_same_idempotency_key_returns_the_first_request() -> None:
    async with open_env() as env:
        async with httpx.AsyncClient(
            base_url=env.horde.url, headers={"apikey": env.requester}
        ) as client:
            body = {"prompt": "Once", "params": {"max_length": 32}}
            headers = {"Idempotency-Key": "text-op-1"}
            first = await client.post("/api/v2/generate/text/async", json=body, headers=headers)
            again = await client.post("/api/v2/generate/text/async", json=body, headers=headers)
            assert first.status_code == again.status_code == 202
            assert again.json()["id"] == first.json()["id"]
            other = {**body, "prompt": "Twice"}
            reused = await client.post("/api/v2/generate/text/async", json=other, headers=headers)
            assert reused.status_code == 409
            assert reused.json()["rc"] == "OperationKeyReused"


async def test_a_downgraded_text_request_resubmitted_with_its_idempotency_key_is_the_first() -> (
    None
):
    # Queued at its allow_downgrade max_length (no kudos up front), it is
    # still the request the client sent: the resubmit gets its id, not 409.
    async with open_env(requester_kudos=0) as env:
        async with httpx.AsyncClient(
            base_url=env.horde.url, headers={"apikey": env.requester}
        ) as client:
            body = {"prompt": "Once", "params": {"max_length": 1024}, "allow_downgrade": True}
            headers = {"Idempotency-Key": "text-op-low"}
            first = await client.post("/api/v2/generate/text/async", json=body, headers=headers)
            assert first.status_code == 202, first.text
            assert "MaxLengthDowngraded" in [w["code"] for w in first.json()["warnings"]]
            again = await client.post("/api/v2/generate/text/async", json=body, headers=headers)
            assert again.status_code == 202, again.text
            assert again.json()["id"] == first.json()["id"]


async def test_the_anonymous_user_s_idempotency_key_is_ignored_and_a_registered_user_s_still_holds() -> (
    None
):
    # Every anonymous caller is one user: a shared key must not hand one
    # caller another's request.
    async with open_env() as env:
        headers = {"Idempotency-Key": "shared-op"}
        ids = []
        for prompt in ("Mine", "Yours", "Yours"):
            body = {"prompt": prompt, "params": {"max_length": 32}}
            answer = await env.client.post(
                "/api/v2/generate/text/async",
                json=body,
                headers={"apikey": "0000000000", **headers},
            )
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["id"])
        assert len(set(ids)) == 3
        body = {"prompt": "Mine", "params": {"max_length": 32}}
        first, again = [
            await env.client.post(
                "/api/v2/generate/text/async",
                json=body,
                headers={"apikey": env.requester, **headers},
            )
            for _ in range(2)
        ]
        assert first.status_code == again.status_code == 202
        assert again.json()["id"] == first.json()["id"]
        assert first.json()["id"] not in ids
