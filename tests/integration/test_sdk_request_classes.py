"""Every text-side request class of horde_sdk 0.18 against a live horde.

The table ``CASES`` holds one case per request class the installed SDK
has for the text horde and the routes every horde shares (users, workers,
kudos, status, documents): the request built with the SDK's own model, and
what must come back. A success is validated with the SDK's response model
for its status; a refusal must be the one the AI Horde gives, with a return
code the SDK knows. ``test_the_table_covers_every_text_side_request_class``
fails when the SDK has a text-side class the table does not run, so that
none is left out.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable

import horde_sdk.ai_horde_api.apimodels as sdk_models
import httpx
import pytest
from horde_sdk.ai_horde_api.apimodels import (
    AIHordeGetPrivacyPolicyRequest,
    AIHordeGetSponsorsRequest,
    AIHordeGetTermsRequest,
    AIHordeHeartbeatRequest,
    AllWorkersDetailsRequest,
    DeleteTextGenerateRequest,
    DeleteWorkerRequest,
    FindUserRequest,
    HordePerformanceRequest,
    HordeStatusModelsAllRequest,
    HordeStatusModelsSingleRequest,
    KudosTransferRequest,
    ListUsersDetailsRequest,
    ModifyUserRequest,
    ModifyWorkerRequest,
    NewsRequest,
    SingleUserDetailsRequest,
    SingleWorkerDetailsRequest,
    SingleWorkerNameDetailsRequest,
    TextGenerateJobPopRequest,
    TextGenerateStatusRequest,
    TextGenerationJobSubmitRequest,
    TextStatsModelsRequest,
    TextStatsModelsTotalRequest,
)
from horde_sdk.ai_horde_api.consts import GENERATION_STATE, MODEL_TYPE
from horde_sdk.generic_api.apimodels import HordeRequest

from hordelite.testing import FakeTextWorker, TestHorde, open_horde
from tests.integration.test_horde_sdk import (
    BRIDGE,
    MODEL,
    WORKER,
    queue,
    refusal,
    send,
    success,
    text_request,
)

pytestmark = pytest.mark.anyio

# The AI Horde's routes of images and interrogation (alchemy): not served
# by a text horde, so not in the table.
_NOT_TEXT = ("/v2/generate/async", "/v2/generate/pop", "/v2/generate/submit")
_NOT_TEXT_PREFIXES = (
    "/v2/generate/check/",
    "/v2/generate/status/",
    "/v2/interrogate/",
    "/v2/stats/img/",
)


def text_side_classes() -> set[str]:
    """The concrete request classes of the installed SDK on the text side."""
    found = set()
    for name, cls in inspect.getmembers(sdk_models, inspect.isclass):
        if not issubclass(cls, HordeRequest) or inspect.isabstract(cls):
            continue
        path = str(cls.get_api_endpoint_subpath())
        if path in _NOT_TEXT or path.startswith(_NOT_TEXT_PREFIXES):
            continue
        found.add(name)
    return found


@dataclasses.dataclass
class Env:
    """A horde with a requester (alice), a worker owner (bob) whose worker
    is online, an admin, a done request and a waiting one."""

    horde: TestHorde
    client: httpx.AsyncClient
    alice: str
    alice_id: str
    bob: str
    bob_handle: str
    admin: str
    worker_id: str
    done_id: str
    waiting_id: str


# What a case expects: None for a success, or (status, rc) for the AI
# Horde's refusal.
Expect = tuple[int, str] | None
Case = Callable[[Env], Awaitable[tuple[HordeRequest, Expect]]]


async def _pop_job(env: Env) -> tuple[HordeRequest, Expect]:
    pop = TextGenerateJobPopRequest(
        apikey=env.bob,
        name=WORKER,
        models=[MODEL],
        max_length=512,
        max_context_length=2048,
        bridge_agent=BRIDGE,
    )
    return pop, None


async def _submit(env: Env) -> tuple[HordeRequest, Expect]:
    async with FakeTextWorker(env.horde.url, env.bob, name=WORKER, models=[MODEL]) as worker:
        await queue(env.client, env.horde, text_request(env.alice))
        job = await worker.pop()
    return (
        TextGenerationJobSubmitRequest(
            apikey=env.bob, id=job["id"], generation="Done.", state=GENERATION_STATE.ok
        ),
        None,
    )


CASES: dict[str, Case] = {
    "AIHordeHeartbeatRequest": lambda env: _ok(AIHordeHeartbeatRequest()),
    "AIHordeGetTermsRequest": lambda env: _ok(AIHordeGetTermsRequest()),
    "AIHordeGetPrivacyPolicyRequest": lambda env: _ok(AIHordeGetPrivacyPolicyRequest()),
    "AIHordeGetSponsorsRequest": lambda env: _ok(AIHordeGetSponsorsRequest()),
    "NewsRequest": lambda env: _ok(NewsRequest()),
    "HordePerformanceRequest": lambda env: _ok(HordePerformanceRequest()),
    "HordeStatusModelsAllRequest": lambda env: _ok(
        HordeStatusModelsAllRequest(type=MODEL_TYPE.text)
    ),
    "HordeStatusModelsSingleRequest": lambda env: _ok(
        HordeStatusModelsSingleRequest(model_name=MODEL)
    ),
    "TextStatsModelsRequest": lambda env: _ok(TextStatsModelsRequest()),
    "TextStatsModelsTotalRequest": lambda env: _ok(TextStatsModelsTotalRequest()),
    "FindUserRequest": lambda env: _ok(FindUserRequest(apikey=env.alice)),
    "ListUsersDetailsRequest": lambda env: _ok(ListUsersDetailsRequest(page=1, sort="kudos")),
    "SingleUserDetailsRequest": lambda env: _ok(SingleUserDetailsRequest(user_id=env.alice_id)),
    # An admin (the AI Horde's moderator) changes a user; a user may not.
    "ModifyUserRequest": lambda env: _ok(
        ModifyUserRequest(apikey=env.admin, user_id=env.alice_id, kudos=5, concurrency=10)
    ),
    "KudosTransferRequest": lambda env: _ok(
        KudosTransferRequest(apikey=env.alice, username=env.bob_handle, amount=1)
    ),
    "AllWorkersDetailsRequest": lambda env: _ok(AllWorkersDetailsRequest()),
    "SingleWorkerDetailsRequest": lambda env: _ok(
        SingleWorkerDetailsRequest(worker_id=env.worker_id)
    ),
    "SingleWorkerNameDetailsRequest": lambda env: _ok(
        SingleWorkerNameDetailsRequest(worker_name=WORKER)
    ),
    "ModifyWorkerRequest": lambda env: _ok(
        ModifyWorkerRequest(apikey=env.bob, worker_id=env.worker_id, info="A test worker")
    ),
    "DeleteWorkerRequest": lambda env: _ok(
        DeleteWorkerRequest(apikey=env.bob, worker_id=env.worker_id)
    ),
    "TextGenerateAsyncRequest": lambda env: _ok(text_request(env.alice)),
    "TextGenerateStatusRequest": lambda env: _ok(TextGenerateStatusRequest(id=env.done_id)),
    "DeleteTextGenerateRequest": lambda env: _ok(DeleteTextGenerateRequest(id=env.waiting_id)),
    "TextGenerateJobPopRequest": _pop_job,
    "TextGenerationJobSubmitRequest": _submit,
}


async def _ok(request: HordeRequest) -> tuple[HordeRequest, Expect]:
    return request, None


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with open_horde() as horde, httpx.AsyncClient(base_url=horde.url, timeout=30) as client:
        alice = await horde.create_key("alice", kudos=1000)
        bob = await horde.create_key("bob")
        admin = await horde.create_key("root", admin=True)
        async with FakeTextWorker(horde.url, bob, name=WORKER, models=[MODEL]) as worker:
            done = await queue(client, horde, text_request(alice))
            assert await worker.serve_one() is not None
        waiting = await queue(client, horde, text_request(alice, "Wait for me"))
        me = (await client.get("/api/v2/find_user", headers={"apikey": alice})).json()
        bob_user = (await client.get("/api/v2/find_user", headers={"apikey": bob})).json()
        worker_row = (await client.get(f"/api/v2/workers/name/{WORKER}")).json()
        yield Env(
            horde,
            client,
            alice,
            str(me["id"]),
            bob,
            bob_user["username"],
            admin,
            worker_row["id"],
            str(done.id_),
            str(waiting.id_),
        )


def test_the_table_covers_every_text_side_request_class() -> None:
    assert set(CASES) == text_side_classes()


@pytest.mark.parametrize("name", sorted(CASES))
async def test_each_text_side_request_class_succeeds_or_gets_the_ai_hordes_refusal(
    env: Env, name: str
) -> None:
    request, expect = await CASES[name](env)
    assert type(request).__name__ == name
    response = await send(env.client, env.horde, request)
    if expect is None:
        pairs = request.get_success_status_response_pairs()
        model = next(iter(pairs.values())) if len(pairs) == 1 else pairs[response.status_code]  # type: ignore[index]
        success(response, request, model)
    else:
        refusal(response, *expect)


async def test_a_user_changing_another_user_gets_the_ai_hordes_not_moderator(env: Env) -> None:
    request = ModifyUserRequest(apikey=env.bob, user_id=env.alice_id, kudos=5)
    refusal(await send(env.client, env.horde, request), 403, "NotModerator")
    kudos = (await env.client.get("/api/v2/find_user", headers={"apikey": env.alice})).json()
    assert kudos["kudos"] < 1000  # nothing added (the done request was paid)


async def test_a_user_renames_itself_and_a_field_not_kept_is_refused_by_name(env: Env) -> None:
    own = ModifyUserRequest(apikey=env.alice, user_id=env.alice_id, username="Alicia")
    answer = success(await send(env.client, env.horde, own), own, sdk_models.ModifyUserResponse)
    assert answer.username == "Alicia"
    vpn = ModifyUserRequest(apikey=env.admin, user_id=env.alice_id, vpn=True)
    error = refusal(await send(env.client, env.horde, vpn), 400, "BadRequest")
    assert "vpn" in error.message
    nothing = ModifyUserRequest(apikey=env.admin, user_id=env.alice_id)
    refusal(await send(env.client, env.horde, nothing), 400, "NoValidActions")
