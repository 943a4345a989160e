"""The AI Horde's status and document routes real clients call first:
/status/performance (KoboldAI Lite on load, the worker bridge every 60 s),
/status/modes, /status/news, /status/models/{name}, /documents/*, and the
empty teams and styles. Each answer is validated by horde_sdk's own model."""

from __future__ import annotations

import httpx
import pytest
from horde_sdk.ai_horde_api.apimodels import (
    HordeDocument,
    HordeModes,
    HordePerformanceResponse,
    HordeStatusModelsAllResponse,
    HordeStatusModelsSingleResponse,
    NewsResponse,
)

from hordelite.config import Config
from hordelite.testing import FakeTextWorker, ManualClock, open_horde
from tests.integration._helpers import assert_refused, submit_text

pytestmark = pytest.mark.anyio


async def test_performance_counts_the_queued_text_requests_their_tokens_and_the_pool() -> None:
    clock = ManualClock()
    async with open_horde(clock=clock) as horde:
        requester = await horde.create_key("alice", kudos=1000)
        owner = await horde.create_key("bob")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["m1"], threads=3) as worker,
        ):
            empty = (await client.get("/api/v2/status/performance")).json()
            HordePerformanceResponse.model_validate(empty)
            assert (empty["queued_text_requests"], empty["text_worker_count"]) == (0, 0)

            await worker.pop()  # online, with its 3 threads
            await submit_text(client, requester, "one", models=["m1"], max_length=100)
            await submit_text(client, requester, "two", models=["m1"], max_length=50, n=2)
            job = await worker.pop()
            await worker.submit(job["id"], "y" * 400)  # 100 tokens, at most its max_length
            paid_tokens = min(job["payload"]["max_length"], 100)

            clock.advance(10)  # past the cached figures
            body = (await client.get("/api/v2/status/performance")).json()
            HordePerformanceResponse.model_validate(body)
            assert (body["text_worker_count"], body["text_thread_count"]) == (1, 3)
            # Image and interrogation figures are 0 on a text horde.
            assert body["queued_requests"] == body["worker_count"] == body["thread_count"] == 0
            # Two jobs left of 100 + 2 x 50 tokens, one of them done.
            queued = 150 if paid_tokens == 50 else 100
            assert (body["queued_text_requests"], body["queued_tokens"]) == (
                1 if queued == 100 else 2,
                queued,
            )
            assert body["past_minute_tokens"] == paid_tokens


async def test_modes_say_the_horde_is_open_and_news_and_documents_are_the_operators() -> None:
    config = Config().replace(
        notices={
            "terms": "Be kind.\n\nNo <script> here.",
            "news": "The horde moved.",
            "news_title": "Moved",
            "news_importance": "Workers",
            "news_published": "2026-12-01",
        }
    )
    async with open_horde(config=config) as horde, httpx.AsyncClient(base_url=horde.url) as client:
        modes = (await client.get("/api/v2/status/modes")).json()
        HordeModes.model_validate(modes)
        assert modes == {"maintenance_mode": False, "invite_only_mode": False}

        news = (await client.get("/api/v2/status/news")).json()
        NewsResponse.model_validate(news)
        assert [
            (n["title"], n["newspiece"], n["importance"], n["date_published"]) for n in news
        ] == [("Moved", "The horde moved.", "Workers", "2026-12-01")]

        html = (await client.get("/api/v2/documents/terms")).json()
        HordeDocument.model_validate(html)
        assert html == {"html": "<p>Be kind.</p><p>No &lt;script&gt; here.</p>"}
        markdown = await client.get("/api/v2/documents/terms", params={"format": "markdown"})
        assert markdown.json() == {"markdown": "Be kind.\n\nNo <script> here."}
        assert (await client.get("/api/v2/documents/privacy")).json() == {"html": ""}
        refused = await client.get("/api/v2/documents/terms", params={"format": "pdf"})
        assert_refused(refused, 400, "BadRequest")
        assert "format" in refused.json()["errors"]


async def test_no_news_is_an_empty_list() -> None:
    async with open_horde() as horde, httpx.AsyncClient(base_url=horde.url) as client:
        assert (await client.get("/api/v2/status/news")).json() == []


def test_a_bad_news_date_or_importance_is_refused_at_start() -> None:
    from hordelite.errors import ConfigError

    with pytest.raises(ConfigError, match=r"notices\.news_published"):
        Config().replace(notices={"news_published": "yesterday"})
    with pytest.raises(ConfigError, match=r"notices\.news_importance"):
        Config().replace(notices={"news_importance": "Gossip"})


async def test_status_models_defaults_to_image_and_a_single_model_is_a_list() -> None:
    async with open_horde() as horde:
        owner = await horde.create_key("bob")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["org/m1", "m2"], threads=2) as worker,
        ):
            await worker.pop()
            # The AI Horde's default type is image: none served here.
            assert (await client.get("/api/v2/status/models")).json() == []
            text = (await client.get("/api/v2/status/models", params={"type": "text"})).json()
            HordeStatusModelsAllResponse.model_validate(text)
            assert sorted(m["name"] for m in text) == ["m2", "org/m1"]

            one = (await client.get("/api/v2/status/models/org/m1")).json()
            HordeStatusModelsSingleResponse.model_validate(one)
            assert [(m["name"], m["count"], m["type"]) for m in one] == [("org/m1", 2, "text")]
            assert (await client.get("/api/v2/status/models/unserved")).json() == []

            least = {"type": "text", "min_count": "3"}
            assert (await client.get("/api/v2/status/models", params=least)).json() == []
            most = {"type": "text", "max_count": "2"}
            assert len((await client.get("/api/v2/status/models", params=most)).json()) == 2
            bad = await client.get("/api/v2/status/models", params={"min_count": "-1"})
            assert_refused(bad, 400, "BadRequest")
            assert "min_count" in bad.json()["errors"]


async def test_teams_and_text_styles_are_empty_and_a_team_is_not_found() -> None:
    async with open_horde() as horde, httpx.AsyncClient(base_url=horde.url) as client:
        assert (await client.get("/api/v2/teams")).json() == []
        assert (await client.get("/api/v2/styles/text")).json() == []
        assert_refused(await client.get("/api/v2/teams/abc"), 404, "TeamNotFound")


async def test_a_queued_requests_status_counts_its_eligible_workers_and_threads() -> None:
    async with open_horde() as horde:
        requester = await horde.create_key("alice", kudos=100)
        owner = await horde.create_key("bob")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, name="a", models=["m1"], threads=2) as a,
            FakeTextWorker(horde.url, owner, name="b", models=["m1"], threads=3) as b,
            FakeTextWorker(horde.url, owner, name="c", models=["m2"]) as c,
        ):
            for worker in (a, b, c):
                await worker.pop()
            served = await submit_text(client, requester, "served", models=["m1"])
            status = (await client.get(f"/api/v2/generate/text/status/{served}")).json()
            assert (status["eligible_workers"], status["eligible_worker_threads"]) == (2, 5)
            assert status["might_stall"] is False
            stuck = await submit_text(client, requester, "stuck", models=["nobody"])
            status = (await client.get(f"/api/v2/generate/text/status/{stuck}")).json()
            assert (status["eligible_workers"], status["might_stall"]) == (0, True)


async def test_a_text_request_as_queued_is_read_back_by_its_requester_only() -> None:
    async with open_horde() as horde:
        requester = await horde.create_key("alice", kudos=100)
        other = await horde.create_key("eve")
        admin = await horde.create_key("root", admin=True)
        async with httpx.AsyncClient(base_url=horde.url) as client:
            request_id = await submit_text(
                client, requester, "Once upon a time", models=["m1"], max_length=60
            )
            path = f"/api/v2/generate/text/request/{request_id}"
            for key in (requester, admin):
                found = await client.get(path, headers={"apikey": key})
                assert found.status_code == 200, found.text
                body = found.json()
                assert (body["prompt"], body["models"]) == ("Once upon a time", ["m1"])
                assert body["params"]["max_length"] == 60
                # horde_sdk 0.33's GenerationSubmittedKobold (0.18 has none).
                assert {"softprompt", "trusted_workers", "slow_workers", "workers"} <= set(body)
                assert (body["worker_blacklist"], body["webhook"]) == (False, None)
            assert_refused(
                await client.get(path, headers={"apikey": other}), 403, "WrongCredentials"
            )
            assert_refused(await client.get(path), 401, "InvalidAPIKey")
            unknown = "/api/v2/generate/text/request/not-an-id"
            assert_refused(
                await client.get(unknown, headers={"apikey": requester}), 404, "RequestNotFound"
            )
