"""Wire compatibility with the real horde_sdk 0.18 (the AI Horde's own Python SDK).

Every request body, header and query below is produced by horde_sdk's pydantic
request models through the SDK's own preparation path
(``_validate_and_prepare_request``, what its sync and async clients call before
sending), sent with httpx to a real horde, and every answer is validated with the
SDK's response model for that status code: a validation error fails the test.

Importing horde_sdk does not touch the network (checked with an audit hook on
socket connects and lookups); the SDK reads its base URL once, at import, from
``AI_HORDE_URL``, so the end-to-end client test points it at the test horde by
setting that module constant.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

import aiohttp
import anyio
import httpx
import pytest
from horde_sdk import RequestErrorResponse
from horde_sdk.ai_horde_api import (
    AIHordeAPIAsyncSimpleClient,
    AIHordeAPIManualClient,
    AIHordePayloadValidationError,
)
from horde_sdk.ai_horde_api.apimodels import (
    AIHordeHeartbeatRequest,
    AIHordeHeartbeatResponse,
    AllWorkersDetailsRequest,
    AllWorkersDetailsResponse,
    FindUserRequest,
    ModelGenerationInputKobold,
    SingleWorkerDetailsRequest,
    SingleWorkerDetailsResponse,
    SingleWorkerNameDetailsRequest,
    TextGenerateAsyncDryRunResponse,
    TextGenerateAsyncRequest,
    TextGenerateAsyncResponse,
    TextGenerateJobPopRequest,
    TextGenerateJobPopResponse,
    TextGenerateStatusRequest,
    TextGenerateStatusResponse,
    TextGenerationJobSubmitRequest,
    UserDetailsResponse,
)
from horde_sdk.ai_horde_api.apimodels import base as sdk_base
from horde_sdk.ai_horde_api.consts import GENERATION_STATE, RC, WORKER_TYPE, WarningCode
from horde_sdk.consts import HTTPStatusCode
from horde_sdk.generic_api.apimodels import HordeRequest, HordeResponse
from pydantic import BaseModel

from hordelite.testing import FakeTextWorker, TestHorde, open_horde
from tests.integration._env import Env, open_env

pytestmark = pytest.mark.anyio

MODEL = "fake-model"
WORKER = "sdk-worker"
BRIDGE = "hordelite-sdk-test:1:https://example.invalid"
# The job TTL the AI Horde hands out with every text job (seconds).
SPEC_JOB_TTL = 150

# The SDK's own request preparation (headers, path, query, body); it is never used to send.
_SDK = AIHordeAPIManualClient()

R = TypeVar("R", bound=BaseModel)


# Sending and reading the way horde_sdk does ---------------------------------


async def send(
    client: httpx.AsyncClient, horde: TestHorde, request: HordeRequest
) -> httpx.Response:
    """Send ``request`` with exactly the method, path, headers, query and body horde_sdk would."""
    prepared = _SDK._validate_and_prepare_request(request)
    sdk_base = request.get_api_url()
    assert prepared.endpoint_no_query.startswith(sdk_base)
    url = f"{horde.url}/api/{prepared.endpoint_no_query[len(sdk_base) :]}"
    response = await client.request(
        request.get_http_method().value,
        url,
        headers=prepared.request_headers,
        params=prepared.request_queries,
        json=prepared.request_body,
    )
    # aiohttp (the SDK's async transport) refuses to decode any other content type.
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return response


def success(response: httpx.Response, request: HordeRequest, model: type[R]) -> R:
    """The answer validated by the SDK model its request declares for this status."""
    pairs = request.get_success_status_response_pairs()
    assert response.status_code in pairs, response.text
    assert pairs[HTTPStatusCode(response.status_code)] is model
    return model.model_validate(response.json())


def refusal(response: httpx.Response, status: int, rc: str) -> RequestErrorResponse:
    """The error body validated by the SDK's error model, with a return code the SDK knows."""
    assert response.status_code == status, response.text
    error = RequestErrorResponse.model_validate(response.json())
    assert error.rc == rc
    assert error.rc in RC.__members__
    assert error.message
    return error


def handled_by_sdk(response: httpx.Response, expected: type[HordeResponse]) -> Any:
    """What the SDK's clients make of this raw answer (they share this code path)."""
    return _SDK._after_request_handling(
        raw_response_json=response.json(),
        returned_status_code=response.status_code,
        expected_response_type=expected,  # type: ignore[type-var]
    )


# Building requests with the SDK's models -------------------------------------


def text_request(
    api_key: str,
    prompt: str = "Once upon a time",
    *,
    fields: dict[str, Any] | None = None,
    **params: Any,
) -> TextGenerateAsyncRequest:
    """An SDK text request; ``fields`` are request fields, ``params`` its Kobold parameters."""
    kobold = {"max_length": 64, "max_context_length": 1024, **params}
    return TextGenerateAsyncRequest(
        apikey=api_key,
        prompt=prompt,
        params=ModelGenerationInputKobold(**kobold),
        models=[MODEL],
        **(fields or {}),
    )


def pop_request(api_key: str, **fields: Any) -> TextGenerateJobPopRequest:
    values: dict[str, Any] = {
        "name": WORKER,
        "models": [MODEL],
        "max_length": 512,
        "max_context_length": 2048,
        "bridge_agent": BRIDGE,
        **fields,
    }
    return TextGenerateJobPopRequest(apikey=api_key, **values)


async def queue(
    client: httpx.AsyncClient, horde: TestHorde, request: TextGenerateAsyncRequest
) -> TextGenerateAsyncResponse:
    response = await send(client, horde, request)
    assert response.status_code == 202, response.text
    return success(response, request, TextGenerateAsyncResponse)


async def pop(
    client: httpx.AsyncClient, horde: TestHorde, request: TextGenerateJobPopRequest
) -> TextGenerateJobPopResponse:
    return success(await send(client, horde, request), request, TextGenerateJobPopResponse)


async def queued_job(client: httpx.AsyncClient, env: Env) -> TextGenerateJobPopResponse:
    """The job of a text request of the requester's, popped by the owner's worker."""
    await queue(client, env.horde, text_request(env.requester))
    return await pop(client, env.horde, pop_request(env.owner))


def status_request_for(accepted: TextGenerateAsyncResponse) -> TextGenerateStatusRequest:
    """The follow-up request the SDK's simple clients build from a 202 answer."""
    follow_up = accepted.get_follow_up_default_request_type()
    request = follow_up.model_validate(accepted.get_follow_up_returned_params()[0])
    assert isinstance(request, TextGenerateStatusRequest)
    return request


# Requests --------------------------------------------------------------------


async def test_an_sdk_text_request_is_accepted_with_202_and_a_uuid_id_and_a_known_warning() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        request = text_request(env.requester)
        response = await send(client, env.horde, request)
        assert response.status_code == HTTPStatusCode.ACCEPTED, response.text
        accepted = success(response, request, TextGenerateAsyncResponse)
        assert isinstance(accepted.id_.root, uuid.UUID)
        assert accepted.kudos is not None
        assert accepted.kudos > 0
        # No worker is online: the request waits, and says so with the AI Horde's warning code.
        assert accepted.warnings is not None
        assert [w.code for w in accepted.warnings] == [WarningCode.NoAvailableWorker]


async def test_an_sdk_dry_run_answers_200_with_the_price_the_real_submit_then_announces() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        dry = text_request(env.requester, fields={"dry_run": True})
        response = await send(client, env.horde, dry)
        assert response.status_code == HTTPStatusCode.OK, response.text
        quote = success(response, dry, TextGenerateAsyncDryRunResponse)
        accepted = await queue(client, env.horde, text_request(env.requester))
        assert quote.kudos == accepted.kudos


async def test_the_sdk_status_follow_up_reads_a_waiting_request_with_integer_times() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        accepted = await queue(client, env.horde, text_request(env.requester))
        request = status_request_for(accepted)
        response = await send(client, env.horde, request)
        status = success(response, request, TextGenerateStatusResponse)
        assert (status.waiting, status.processing, status.finished, status.done) == (1, 0, 0, False)
        assert status.generations == []
        assert not status.is_job_complete(1)
        # The SDK declares these as int; a float (even 3.0) is a different wire type.
        raw = response.json()
        assert type(raw["wait_time"]) is int
        assert type(raw["queue_position"]) is int


async def test_the_sdk_status_of_a_done_request_holds_the_one_generation_it_waits_for() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        accepted = await queue(client, env.horde, text_request(env.requester, "Tell me a story"))
        job = await pop(client, env.horde, pop_request(env.owner))
        assert job.id_ is not None
        submit = TextGenerationJobSubmitRequest(
            apikey=env.owner,
            id=job.id_,
            generation="Once there was a horde.",
            state=GENERATION_STATE.ok,
        )
        success(
            await send(client, env.horde, submit),
            submit,
            type(submit).get_default_success_response_type(),
        )
        request = status_request_for(accepted)
        status = success(
            await send(client, env.horde, request), request, TextGenerateStatusResponse
        )
        assert status.done is True
        assert status.is_job_complete(1)
        (generation,) = status.generations
        assert generation.text == "Once there was a horde."
        assert generation.state == GENERATION_STATE.ok
        assert generation.model == MODEL
        assert generation.worker_name == WORKER


async def test_the_sdk_cleanup_delete_cancels_a_waiting_request_and_answers_its_status() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        accepted = await queue(client, env.horde, text_request(env.requester))
        (cleanup,) = accepted.get_follow_up_failure_cleanup_request()
        assert cleanup.get_http_method() == "DELETE"
        response = await send(client, env.horde, cleanup)
        before = success(response, cleanup, TextGenerateStatusResponse)
        assert (before.waiting, before.finished) == (1, 0)
        # Cancelled: no worker is handed the request any more.
        job = await pop(client, env.horde, pop_request(env.owner))
        assert job.id_ is None


# Jobs ------------------------------------------------------------------------


async def test_an_sdk_pop_without_a_job_validates_and_counts_what_it_skipped() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        empty = await pop(client, env.horde, pop_request(env.owner))
        assert (empty.id_, empty.ids, empty.model) == (None, [], None)
        assert empty.skipped.is_empty()
        # A request needing more context than the worker offers is skipped, and counted.
        await queue(client, env.horde, text_request(env.requester, max_context_length=4096))
        skipped = await pop(client, env.horde, pop_request(env.owner, max_context_length=2048))
        assert (skipped.id_, skipped.ids) == (None, [])
        assert skipped.skipped.max_context_length == 1


async def test_an_sdk_pop_with_a_job_validates_with_its_kobold_payload() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        await queue(
            client,
            env.horde,
            text_request(
                env.requester,
                "The prompt",
                max_length=96,
                max_context_length=1024,
                temperature=0.7,
                top_p=0.9,
                stop_sequence=["\nUser:"],
            ),
        )
        job = await pop(client, env.horde, pop_request(env.owner))
        assert job.id_ is not None
        assert job.ids == [job.id_]
        assert job.model == MODEL
        assert job.ttl == SPEC_JOB_TTL
        payload = job.payload
        assert payload.prompt == "The prompt"
        assert (payload.n, payload.max_length, payload.max_context_length) == (1, 96, 1024)
        assert (payload.temperature, payload.top_p) == (0.7, 0.9)
        assert payload.stop_sequence == ["\nUser:"]


async def test_an_sdk_job_submit_is_answered_with_a_positive_reward() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        job = await queued_job(client, env)
        assert job.id_ is not None
        submit = TextGenerationJobSubmitRequest(
            apikey=env.owner, id=job.id_, generation="word " * 30, state=GENERATION_STATE.ok
        )
        response = await send(client, env.horde, submit)
        answer = success(response, submit, type(submit).get_default_success_response_type())
        assert answer.reward > 0


# Status and accounts ---------------------------------------------------------


async def test_the_sdk_heartbeat_validates_with_message_ok() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        request = AIHordeHeartbeatRequest()
        beat = success(await send(client, horde, request), request, AIHordeHeartbeatResponse)
        assert beat.message == "OK"
        assert beat.version


async def test_the_sdk_find_user_validates_with_alias_hash_id_and_kudos() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        lent = await client.put(
            f"{env.horde.url}/api/v2/sharedkeys",
            headers={"apikey": env.requester},
            json={"name": "k"},
        )
        request = FindUserRequest(apikey=env.requester)
        user = success(await send(client, env.horde, request), request, UserDetailsResponse)
        assert user.id_ is not None
        assert user.username == f"alice#{user.id_}"
        assert user.kudos == 100
        assert user.sharedkey_ids == [lent.json()["id"]]
        # Found by the shared key: its lender, named as the AI Horde names it.
        request = FindUserRequest(apikey=lent.json()["id"])
        user = success(await send(client, env.horde, request), request, UserDetailsResponse)
        assert user.username == f"alice#{user.id_} (Shared Key: k)"


async def test_the_sdk_worker_details_by_name_by_id_and_in_the_list_validate() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        owner = await horde.create_key("owner")
        await pop(client, horde, pop_request(owner, max_length=256, max_context_length=2048))
        by_name = SingleWorkerNameDetailsRequest(worker_name=WORKER)
        named = success(await send(client, horde, by_name), by_name, SingleWorkerDetailsResponse)
        assert named.type_ == WORKER_TYPE.text
        assert (named.name, named.online, named.maintenance_mode) == (WORKER, True, False)
        assert (named.models, named.max_length, named.max_context_length) == ([MODEL], 256, 2048)
        assert named.bridge_agent == BRIDGE
        by_id = SingleWorkerDetailsRequest(worker_id=str(named.id_))
        detail = success(await send(client, horde, by_id), by_id, SingleWorkerDetailsResponse)
        assert (detail.id_, detail.name) == (named.id_, WORKER)
        # The SDK's default listing asks for every worker type (``type=``).
        listing = AllWorkersDetailsRequest()
        workers = success(await send(client, horde, listing), listing, AllWorkersDetailsResponse)
        assert [w.name for w in workers] == [WORKER]


# Refusals --------------------------------------------------------------------


async def test_an_unknown_request_id_is_a_404_RequestNotFound_the_sdk_reads() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        request = TextGenerateStatusRequest(id=str(uuid.uuid4()))
        response = await send(client, horde, request)
        refusal(response, 404, "RequestNotFound")
        assert isinstance(
            handled_by_sdk(response, TextGenerateStatusResponse), RequestErrorResponse
        )


async def test_an_unknown_api_key_is_a_401_InvalidAPIKey_the_sdk_reads() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        response = await send(client, horde, text_request("x" * 22))
        refusal(response, 401, "InvalidAPIKey")
        assert isinstance(handled_by_sdk(response, TextGenerateAsyncResponse), RequestErrorResponse)


async def test_find_user_with_an_unknown_key_is_a_404_UserNotFound_the_sdk_reads() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        refusal(await send(client, horde, FindUserRequest(apikey="y" * 22)), 404, "UserNotFound")


async def test_an_unknown_worker_id_is_a_404_WorkerNotFound_the_sdk_reads() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        request = SingleWorkerDetailsRequest(worker_id=str(uuid.uuid4()))
        refusal(await send(client, horde, request), 404, "WorkerNotFound")


async def test_a_field_validation_failure_is_a_400_the_sdk_raises_as_payload_validation_error() -> (
    None
):
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        request = text_request(env.requester, fields={"webhook": "http://example.invalid/hook"})
        response = await send(client, env.horde, request)
        error = refusal(response, 400, "BadRequest")
        assert "webhook" in response.json()["errors"]
        with pytest.raises(AIHordePayloadValidationError, match=error.message):
            handled_by_sdk(response, TextGenerateAsyncResponse)


async def test_a_context_shorter_than_max_length_is_a_400_TokenOverflow_the_sdk_reads() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        response = await send(
            client, env.horde, text_request(env.requester, max_length=512, max_context_length=256)
        )
        refusal(response, 400, "TokenOverflow")
        assert isinstance(handled_by_sdk(response, TextGenerateAsyncResponse), RequestErrorResponse)


async def test_the_anonymous_key_popping_is_a_403_AnonForbiddenWorker_the_sdk_reads() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        refusal(await send(client, horde, pop_request("0000000000")), 403, "AnonForbiddenWorker")


async def test_a_second_submit_of_one_job_is_a_400_DuplicateGen_the_sdk_reads() -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient() as client,
    ):
        job = await queued_job(client, env)
        submit = TextGenerationJobSubmitRequest(
            apikey=env.owner, id=job.id_, generation="done", state=GENERATION_STATE.ok
        )
        assert (await send(client, env.horde, submit)).status_code == 200
        refusal(await send(client, env.horde, submit), 400, "DuplicateGen")


# The SDK's own async client, end to end -------------------------------------------


async def test_the_sdk_async_simple_client_runs_a_text_generation_end_to_end(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("horde_sdk's async client is aiohttp, which runs on asyncio only")
    async with open_env() as env:
        # The SDK reads AI_HORDE_URL once, at import: point its requests at this horde.
        monkeypatch.setattr(sdk_base, "AI_HORDE_BASE_URL", f"{env.horde.url}/api/")
        async with (
            aiohttp.ClientSession() as session,
            FakeTextWorker(env.horde.url, env.owner, name=WORKER, models=[MODEL]) as worker,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(worker.serve_one, 20)
            client = AIHordeAPIAsyncSimpleClient(aiohttp_session=session, apikey=env.requester)
            request = TextGenerateAsyncRequest(
                prompt="Hello SDK",
                params=ModelGenerationInputKobold(max_length=32, max_context_length=1024),
                models=[MODEL],
            )
            with anyio.fail_after(15):
                status, job_id = await client.text_generate_request(request, timeout=30)
        assert isinstance(status, TextGenerateStatusResponse)
        assert status.done is True
        (generation,) = status.generations
        assert generation.text == worker.generate("Hello SDK")
        assert generation.worker_name == WORKER
        assert isinstance(job_id.root, uuid.UUID)
