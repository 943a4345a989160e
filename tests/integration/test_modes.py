"""The horde's modes over real HTTP, on SQLite and PostgreSQL: GET and PUT
/status/modes (admins only, audited), maintenance (no new request, native
or OpenAI, while what is in flight completes), raid mode (anonymous
requests refused or throttled, new worker names refused, known workers
popping) and invite-only mode."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from horde_sdk.ai_horde_api.apimodels import HordeModes

from hordelite.config import Config
from hordelite.contract.audit_query import AuditQuery
from hordelite.contract.limits import ANONYMOUS_API_KEY
from hordelite.testing import open_horde
from tests.integration._env import TLS, Env, client_for, open_env
from tests.integration._helpers import assert_refused, eventually

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings(
        "ignore:Async generator '(openai|httpx|httpcore)\\.:ResourceWarning"
    ),
]

MODES = "/api/v2/status/modes"


async def put_modes(env: Env, key: str, **body: Any) -> httpx.Response:
    return await env.client.put(MODES, headers={"apikey": key}, json=body)


async def set_modes(env: Env, admin: str, **body: Any) -> dict[str, Any]:
    response = await put_modes(env, admin, **body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def submit(env: Env, key: str, prompt: str = "Once upon") -> httpx.Response:
    body = {"prompt": prompt, "params": {"max_length": 16}, "models": [env.model]}
    return await env.client.post("/api/v2/generate/text/async", headers={"apikey": key}, json=body)


@contextlib.asynccontextmanager
async def openai_client(env: Env, key: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with (
        httpx.AsyncClient(verify=TLS, timeout=30) as http,
        openai.AsyncOpenAI(
            base_url=env.horde.url + "/v1", api_key=key, max_retries=0, http_client=http
        ) as client,
    ):
        yield client


async def test_get_reports_the_modes_and_only_an_admin_sets_them_each_change_audited(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        admin = await env.horde.create_key("root", admin=True)
        anyone = await env.client.get(MODES)
        assert anyone.json() == {"maintenance_mode": False, "invite_only_mode": False}
        HordeModes.model_validate(anyone.json())

        for key in (env.owner, ANONYMOUS_API_KEY):
            refused = await put_modes(env, key, maintenance_mode=True)
            assert_refused(refused, 403, "NotModerator")
        assert_refused(await put_modes(env, "no-such-key", raid_mode=True), 401, "InvalidAPIKey")
        assert_refused(await put_modes(env, admin), 400, "NoHordeModSelected")
        bad = assert_refused(await put_modes(env, admin, raid_mode="yes"), 400, "BadRequest")
        assert "raid_mode" in bad["errors"]
        assert (await env.client.get(MODES)).json()["maintenance_mode"] is False

        assert await set_modes(env, admin, raid_mode=True) == {"raid_mode": True}
        assert await set_modes(env, admin, invite_only_mode=True, raid_mode=None) == {
            "invite_only_mode": True
        }
        # Raid mode is shown to an admin's key only; another key is refused.
        shown = await env.client.get(MODES, headers={"apikey": admin})
        assert shown.json() == {
            "maintenance_mode": False,
            "invite_only_mode": True,
            "raid_mode": True,
        }
        HordeModes.model_validate(shown.json())
        assert (await env.client.get(MODES)).json() == {
            "maintenance_mode": False,
            "invite_only_mode": True,
        }
        assert_refused(
            await env.client.get(MODES, headers={"apikey": env.owner}), 403, "NotModerator"
        )

        entries = await env.horde.horde.store.read_audit(query=AuditQuery(actions=("mode.set",)))
        assert [e.detail["set"] for e in entries] == [{"invite_only": True}, {"raid": True}]
        root_id = (await env.client.get("/api/v2/find_user", headers={"apikey": admin})).json()[
            "id"
        ]
        assert {(e.actor, e.actor_id, e.address) for e in entries} == {
            (f"root#{root_id}", root_id, "127.0.0.1")
        }
        assert entries[0].detail["before"]["invite_only"] is False
        assert entries[0].detail["after"] == {
            "maintenance": False,
            "invite_only": True,
            "raid": True,
        }


async def test_maintenance_refuses_new_requests_native_and_openai_while_queued_jobs_complete(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        admin = await env.horde.create_key("root", admin=True)
        worker = await env.text_worker("w")
        in_flight = await env.submit_text("first")
        queued = await env.submit_text("second")
        popped = await worker.pop()
        assert popped["id"] is not None

        await set_modes(env, admin, maintenance_mode=True)
        assert (await env.client.get(MODES)).json()["maintenance_mode"] is True
        refused = await submit(env, env.requester)
        assert_refused(refused, 400, "MaintenanceMode", "maintenance")
        chat = await env.client.post(
            "/api/v2/generate/chat/async",
            headers={"apikey": env.requester},
            json={"model": env.model, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert_refused(chat, 400, "MaintenanceMode")
        async with openai_client(env, env.requester) as client:
            with pytest.raises(openai.BadRequestError) as raised:
                await client.chat.completions.create(
                    model=env.model, messages=[{"role": "user", "content": "hi"}]
                )
            assert raised.value.code == "MaintenanceMode"
            with pytest.raises(openai.BadRequestError) as raised:
                await client.completions.create(model=env.model, prompt="Once upon")
            assert raised.value.code == "MaintenanceMode"

        # The job in flight is submitted and its request completes; the one
        # still queued is popped and completes too.
        await worker.submit(popped["id"], "the end")
        assert (await env.text_status(in_flight))["done"] is True
        assert await worker.serve_one() is not None
        assert (await env.text_status(queued))["done"] is True

        await set_modes(env, admin, maintenance_mode=False)
        assert (await submit(env, env.requester)).status_code == 202


async def test_raid_mode_refuses_anonymous_requests_and_new_workers_while_known_ones_pop(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        admin = await env.horde.create_key("root", admin=True)
        trusted = await env.horde.create_key("carol", trusted=True)
        known = await env.text_worker("known")
        assert (await known.pop())["id"] is None  # registered before the raid
        await set_modes(env, admin, raid_mode=True)

        refused = assert_refused(await submit(env, ANONYMOUS_API_KEY), 403, "AnonymousDisabled")
        assert "raid" not in refused["message"].lower()  # silent
        async with openai_client(env, ANONYMOUS_API_KEY) as client:
            with pytest.raises(openai.APIStatusError) as raised:
                await client.completions.create(model=env.model, prompt="Once upon")
            assert raised.value.code == "AnonymousDisabled"
        # A registered user's request is queued, and the known worker takes it.
        request_id = await env.submit_text("mine")
        assert await known.serve_one() is not None
        assert (await env.text_status(request_id))["done"] is True

        newcomer = await env.text_worker("newcomer")
        new = await env.client.post(
            "/api/v2/generate/text/pop", headers={"apikey": env.owner}, json=newcomer.pop_body()
        )
        body = assert_refused(new, 403, "WorkerInviteOnly")
        assert "raid" not in body["message"].lower()
        assert (await env.client.get("/api/v2/workers/name/newcomer")).status_code == 404
        # The anonymous user still gets the pop's own refusal.
        anon = await env.client.post(
            "/api/v2/generate/text/pop",
            headers={"apikey": ANONYMOUS_API_KEY},
            json=newcomer.pop_body(),
        )
        assert_refused(anon, 403, "AnonForbiddenWorker")
        # A trusted owner's new worker is let in (the AI Horde's exemption).
        vouched = await env.text_worker("vouched", key=trusted)
        assert (await vouched.pop())["id"] is None

        await set_modes(env, admin, raid_mode=False)
        assert (await submit(env, ANONYMOUS_API_KEY)).status_code == 202
        assert (await newcomer.pop())["id"] is not None  # takes the anonymous request


async def test_raid_mode_throttles_anonymous_requests_per_address_when_configured(
    chat_database: str | None,
) -> None:
    config = Config().replace(
        moderation={"raid_anonymous": "throttle", "raid_anonymous_per_minute": 2}
    )
    async with open_env(database=chat_database, config=config) as env:
        admin = await env.horde.create_key("root", admin=True)
        await set_modes(env, admin, raid_mode=True)
        for _ in range(2):
            assert (await submit(env, ANONYMOUS_API_KEY)).status_code == 202
        throttled = await submit(env, ANONYMOUS_API_KEY)
        body = assert_refused(throttled, 429, "RequestRateExceeded")
        # Silent: no time to wait, no reason.
        assert "retry-after" not in throttled.headers
        assert set(body) == {"message", "rc"}
        # A registered user is not throttled.
        for _ in range(3):
            assert (await submit(env, env.requester)).status_code == 202


async def test_invite_only_mode_refuses_a_new_worker_name_of_an_untrusted_owner(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        admin = await env.horde.create_key("root", admin=True)
        known = await env.text_worker("known")
        await known.pop()
        await set_modes(env, admin, invite_only_mode=True)
        newcomer = await env.text_worker("newcomer")
        response = await env.client.post(
            "/api/v2/generate/text/pop", headers={"apikey": env.owner}, json=newcomer.pop_body()
        )
        assert_refused(response, 403, "WorkerInviteOnly")
        assert (await known.pop())["id"] is None
        # Anonymous requests are not touched by invite-only mode.
        assert (await submit(env, ANONYMOUS_API_KEY)).status_code == 202
        await set_modes(env, admin, invite_only_mode=False)
        assert (await newcomer.pop())["id"] is not None


@pytest.mark.postgres
async def test_a_second_horde_on_the_same_postgresql_database_sees_a_change_within_seconds(
    migrated_schema_url: str,
) -> None:
    # No shared signals: the second horde sees the change by its interval.
    # The polling submits pass the requester's budget: their refusals must
    # not time the test's address out (tests/integration/test_addresses.py).
    config = Config().replace(signals={"url": ""}, moderation={"budget_refusals_per_offence": 0})
    async with (
        open_env(database=migrated_schema_url, config=config) as env,
        open_horde(database=migrated_schema_url, config=config) as replica,
        client_for(replica) as other,
    ):
        admin = await env.horde.create_key("root", admin=True)
        body = {"prompt": "hi", "params": {"max_length": 16}, "models": [env.model]}

        async def submit_there() -> httpx.Response:
            headers = {"apikey": env.requester}
            return await other.post("/api/v2/generate/text/async", headers=headers, json=body)

        assert (await submit_there()).status_code == 202  # its snapshot is read
        await set_modes(env, admin, maintenance_mode=True)

        async def refused() -> bool:
            return (await submit_there()).status_code == 400

        await eventually(refused, within=10)
        assert_refused(await submit_there(), 400, "MaintenanceMode")
        assert (await other.get(MODES)).json()["maintenance_mode"] is True


async def test_a_process_draining_for_shutdown_shows_maintenance_mode() -> None:
    async with open_env() as env:
        modes, raid_shown = await env.horde.horde.modes.show(None)
        assert (modes.maintenance, raid_shown) == (False, False)
        env.horde.horde.core.stopping = True  # as Upkeep.begin_shutdown sets it
        try:
            modes, _ = await env.horde.horde.modes.show(None)
            assert modes.maintenance is True
        finally:
            env.horde.horde.core.stopping = False
